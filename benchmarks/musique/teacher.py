"""The MuSiQue teacher: a scripted engine that searches the supporting paragraphs' titles, then answers.

For the SFT warm start the real Agents SDK agent runs against it through the PolicyServer, so the
recorded calls carry the agent's own prompts, tool-call format and token ids: one ``search`` call per
supporting paragraph (its title as the query, at most ``max_searches``), then
``<answer>gold answer</answer>``.

>>> task = {"question": "Who founded the label of Album X?", "answers": ["Jane Doe"], "supporting": [0, 1]}
>>> reply = teacher_reply({task["question"]: task}, titles=["Album X", "Label Y"], max_searches=2)
>>> reply([{"role": "user", "content": task["question"]}])
{'tool_calls': [{'name': 'search', 'arguments': {'query': 'Album X'}}]}
>>> reply([{"role": "user", "content": task["question"]}, {"role": "assistant", "content": None},
...        {"role": "tool", "content": "..."}, {"role": "assistant", "content": None},
...        {"role": "tool", "content": "..."}])
'<answer>Jane Doe</answer>'
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["make_teacher", "teacher_reply"]


def teacher_reply(
    by_question: dict[str, dict[str, Any]], titles: Sequence[str], max_searches: int = 2
) -> Callable[[list[dict[str, Any]]], Any]:
    """``messages -> reply``: the next gold search (a supporting paragraph's title) or the answer."""

    def reply(messages: list[dict[str, Any]]) -> Any:
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        question = messages[last_user].get("content")
        task = by_question.get(question if isinstance(question, str) else "")
        if task is None:
            return "<answer>unknown</answer>"
        done = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant")
        queries = list(dict.fromkeys(titles[i] for i in task.get("supporting") or ()))[:max_searches]
        if done < len(queries):
            return {"tool_calls": [{"name": "search", "arguments": {"query": queries[done]}}]}
        return f"<answer>{task['answers'][0]}</answer>"

    return reply


def make_teacher(tasks: Sequence[dict[str, Any]], max_turns: int, model: str = "smollm2-135m") -> Any:
    """An ``agl.engines.ScriptedEngine`` (the policy's tokenizer) that answers ``tasks`` by their gold
    searches: ``max_turns - 1`` searches at most, so that the answer fits in the agent's turns."""
    from agentlightning_lite.serving.engines import ScriptedEngine

    from .data import load_corpus

    corpora = {t["corpus"] for t in tasks}
    if len(corpora) != 1:
        raise ValueError("the teacher's tasks must share one corpus (one split)")
    titles = load_corpus(corpora.pop()).titles
    reply = teacher_reply({t["question"]: t for t in tasks}, titles, max(max_turns - 1, 0))
    return ScriptedEngine(reply, tokenizer=model)
