"""The Spider teacher: a scripted engine whose writer writes the gold SQL and whose checker accepts it.

For the SFT warm start the real LangGraph agent runs against it through the PolicyServer; the writer's
recorded calls (prompt with the schema, reply with the gold query in a ```sql block, token ids as the
policy would produce them) are the warm start's data. The checker's calls are recorded too but never
trained (the trainer keeps the writer and the rewriter only).

>>> task = {"question": "How many heads are older than 56?",
...         "query": "SELECT count(*) FROM head WHERE age > 56"}
>>> reply = teacher_reply({task["question"]: task})
>>> print(reply([{"role": "system", "content": "You write one SQLite query..."},
...              {"role": "user", "content": "Question: " + task["question"]}]))
```sql
SELECT count(*) FROM head WHERE age > 56;
```
>>> reply([{"role": "system", "content": "You check a SQLite query..."},
...        {"role": "user", "content": "Question: " + task["question"] + "\\n\\nQuery: ..."}])
'THE QUERY IS CORRECT.'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["make_teacher", "teacher_reply"]


def _question(messages: list[dict[str, Any]]) -> str:
    for m in messages:
        content = m.get("content")
        if m.get("role") == "user" and isinstance(content, str) and content.startswith("Question: "):
            return content[len("Question: ") :].split("\n\nQuery:", 1)[0].split("\n\nPrevious query:", 1)[0]
    return ""


def teacher_reply(by_question: dict[str, dict[str, Any]]) -> Callable[[list[dict[str, Any]]], Any]:
    """``messages -> reply``: the gold query for the writer and rewriter, a pass for the checker."""

    def reply(messages: list[dict[str, Any]]) -> Any:
        system = next((m.get("content") or "" for m in messages if m.get("role") == "system"), "")
        if str(system).startswith("You check"):
            return "THE QUERY IS CORRECT."
        task = by_question.get(_question(messages))
        sql = task["query"].strip().rstrip(";").strip() if task else "SELECT 1"
        return f"```sql\n{sql};\n```"

    return reply


def make_teacher(tasks: Sequence[dict[str, Any]], model: str = "smollm2-135m") -> Any:
    """An ``agl.engines.ScriptedEngine`` (the policy's tokenizer) that writes the gold SQL of ``tasks``."""
    from agentlightning_lite.serving.engines import ScriptedEngine

    return ScriptedEngine(teacher_reply({t["question"]: t for t in tasks}), tokenizer=model)
