"""The Spider SQL agent: a LangGraph graph of three LLM roles (writer, checker, rewriter), as in the paper.

::

    question + schema ──► writer ──► checker ──(THE QUERY IS CORRECT)──► END
                                       ▲  │
                                       │  └─(otherwise)──► rewriter
                                       └─────────────────────┤
                 (after the writer or a rewriter, once max_turns queries are written) ──► END

- **writer**: question + ``CREATE TABLE`` schema → a SQLite query;
- **checker**: runs the query read-only (a ``run_sql`` tool: ``readonly.run_query``), reads the
  rows or the error and ends with ``THE QUERY IS CORRECT.`` or ``THE QUERY IS INCORRECT.``;
- **rewriter**: the previous query, its result and the checker's feedback → a new query.

``max_turns`` counts the queries written (writer + rewrites); the last query is not checked (its
check could change nothing), so ``max_turns=1`` is the writer alone. The reward is Spider's
execution accuracy of the final query (``exec_eval.execution_match``). :data:`AIR` adds the
system's own signal: a query that the checker's ``run_sql`` ran earns the call that wrote it +0.1,
one that failed (a syntax error, an unknown column, a time-out) -0.1.

Every LLM call carries its role as ``metadata={"agent": ...}`` and ``LightningCallback`` records the
run, so ``agl.transitions(store, agents=["writer", "rewriter"])`` trains the writer and the rewriter
while the checker stays frozen.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any, Literal, TypedDict

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import StructuredTool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agentlightning_lite as agl
from agentlightning_lite.adapters.langchain import LightningCallback

from .. import _harness
from .exec_eval import execution_match
from .readonly import SQLError, run_query

#: the roles whose calls are trained; the checker's calls are recorded but never training data
TRAINED_AGENTS = ("writer", "rewriter")


def _sql_ran(span: Any) -> float:
    return 0.1 if span.status == "ok" else -0.1


#: AIR: a written query that ``run_sql`` ran earns its call +0.1, one that failed -0.1 (the last call
#: before a ``run_sql`` span is the writer's or rewriter's call that wrote the query)
AIR = [agl.air.Rule(lambda s: s.kind == "tool" and s.name == "run_sql", _sql_ran, name="sql_ran")]
#: the final reward (execution accuracy) plus each call's own intermediate reward
CREDIT = agl.credit.FinalReward(add_intermediate=True)

WRITER_SYSTEM = """You write one SQLite query that answers a question about this database.

{schema}

Use only these tables and columns. Reply with the query in a ```sql code block, for example:
```sql
SELECT count(*) FROM head WHERE age > 56;
```"""

CHECKER_SYSTEM = """You check a SQLite query written to answer a question about this database.

{schema}

Look for wrong tables, columns, joins, conditions or aggregation, and for an error or an implausible
result. Briefly list the mistakes, then end with exactly one of:
THE QUERY IS CORRECT.
THE QUERY IS INCORRECT."""

REWRITER_SYSTEM = """You fix a SQLite query so that it answers a question about this database.

{schema}

Use only these tables and columns. Address the feedback. Reply with the new query in a ```sql code block."""

_FENCED = re.compile(r"```[ \t]*(?:sql|sqlite)?[ \t]*\n?(.*?)(?:```|$)", re.DOTALL | re.IGNORECASE)
_BARE = re.compile(r"\b(SELECT|WITH)\b.*", re.DOTALL | re.IGNORECASE)
_VERDICT = re.compile(r"THE QUERY IS (CORRECT|INCORRECT)", re.IGNORECASE)


def extract_sql(text: str) -> str | None:
    """The query in a reply: the last ```sql block (closed or cut off), else from the first SELECT/WITH.

    >>> extract_sql("Here:\\n```sql\\nSELECT name FROM singer;\\n```")
    'SELECT name FROM singer'
    >>> extract_sql("SELECT count(*) FROM singer; -- all of them")
    'SELECT count(*) FROM singer'
    >>> extract_sql("I do not know.") is None
    True
    """
    blocks = [b.strip() for b in _FENCED.findall(text) if b.strip()]
    candidate = blocks[-1] if blocks else None
    if candidate is None:
        bare = _BARE.search(text)
        candidate = bare.group(0) if bare else None
    if candidate is None:
        return None
    sql = candidate.split(";", 1)[0].strip()  # one statement; a ';' inside a literal is cut too, rarely
    return sql or None


def verdict_correct(feedback: str) -> bool:
    """The checker's verdict: its last ``THE QUERY IS (IN)CORRECT`` phrase (any case); none means incorrect.

    >>> verdict_correct("Wrong table.\\nTHE QUERY IS INCORRECT."), verdict_correct("The query is correct.")
    (False, True)
    """
    found = _VERDICT.findall(feedback)
    return bool(found) and found[-1].upper() == "CORRECT"


def describe(rows: list[tuple[object, ...]], max_rows: int = 5, width: int = 300) -> str:
    """What a query returned, for the checker and the rewriter: the first rows and the count.

    >>> describe([(1, "a"), (2, "b")])
    "(1, 'a')\\n(2, 'b')\\n(2 rows)"
    """
    shown = "\n".join(repr(tuple(r)) for r in rows[:max_rows])[:width]
    more = f"... {len(rows)} rows" if len(rows) > max_rows else f"({len(rows)} rows)"
    return f"{shown}\n{more}" if shown else "(0 rows)"


class AgentState(TypedDict, total=False):
    """What flows through the graph."""

    question: str
    schema: str
    query: str  #: the current query
    first_query: str  #: the writer's query (to measure what the rewrites add)
    result: str  #: ``describe`` of the current query's execution
    feedback: str  #: the checker's last reply
    correct: bool  #: the checker's last verdict
    turns: int  #: queries written so far


@dataclasses.dataclass(frozen=True)
class SpiderAgent:
    """The training agent: ``SpiderAgent()(task, llm) -> reward`` (1.0 when the final query's results
    match the gold query's, else 0.0).

    ``temperature`` applies to the writer and the rewriter (sampled for GRPO, 0 for evaluation); the
    checker is always greedy. With ``per_agent_endpoints`` each role calls through its own endpoint
    (``llm.for_agent(role)``), so a server with one adapter per agent serves each role with its own.
    """

    max_turns: int = 3
    max_tokens: int = 256
    temperature: float = 1.0
    sql_timeout_s: float = 2.0
    per_agent_endpoints: bool = False

    def __post_init__(self) -> None:
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")

    def _model(self, llm: agl.LLM, temperature: float, stop: list[str] | None = None) -> ChatOpenAI:
        return ChatOpenAI(
            base_url=llm.base_url,
            api_key=llm.api_key,
            model=llm.model,
            temperature=temperature,
            max_tokens=self.max_tokens,
            stop=stop,
            max_retries=0,
            timeout=1800,
        )

    def graph(self, llm: agl.LLM, db_path: Path | str) -> Any:
        """The compiled LangGraph graph for one rollout on the database at ``db_path``."""

        def endpoint(role: str) -> agl.LLM:
            return llm.for_agent(role) if self.per_agent_endpoints else llm

        # a query ends at its first ';'
        write = self._model(endpoint("writer"), self.temperature, stop=[";"])
        rewrite = self._model(endpoint("rewriter"), self.temperature, stop=[";"])
        judge = self._model(endpoint("checker"), 0.0)

        def execute(sql: str) -> str:
            """Run a SQLite query read-only and return its first rows."""
            return describe(run_query(db_path, sql, timeout_s=self.sql_timeout_s))

        run_sql = StructuredTool.from_function(execute, name="run_sql")

        def call(model: ChatOpenAI, role: str, messages: list[BaseMessage], config: RunnableConfig) -> str:
            reply = model.invoke(messages, config={**config, "metadata": {"agent": role}})
            return str(reply.content)

        def writer(state: AgentState, config: RunnableConfig) -> AgentState:
            text = call(
                write,
                "writer",
                [
                    SystemMessage(WRITER_SYSTEM.format(schema=state["schema"])),
                    HumanMessage(f"Question: {state['question']}"),
                ],
                config,
            )
            query = extract_sql(text) or text.strip()
            return {"query": query, "first_query": query, "turns": 1}

        def checker(state: AgentState, config: RunnableConfig) -> AgentState:
            try:
                result = run_sql.invoke(state["query"], config={**config, "metadata": {"agent": "checker"}})
            except SQLError as exc:  # recorded as a failed tool span; the checker sees the error
                result = f"Error: {exc}"[:300]
            feedback = call(
                judge,
                "checker",
                [
                    SystemMessage(CHECKER_SYSTEM.format(schema=state["schema"])),
                    HumanMessage(
                        f"Question: {state['question']}\n\nQuery:\n```sql\n{state['query']}\n```\n\n"
                        f"Result:\n{result}"
                    ),
                ],
                config,
            )
            return {"result": result, "feedback": feedback, "correct": verdict_correct(feedback)}

        def rewriter(state: AgentState, config: RunnableConfig) -> AgentState:
            text = call(
                rewrite,
                "rewriter",
                [
                    SystemMessage(REWRITER_SYSTEM.format(schema=state["schema"])),
                    HumanMessage(
                        f"Question: {state['question']}\n\nPrevious query:\n```sql\n{state['query']}\n```\n\n"
                        f"Result:\n{state['result']}\n\nFeedback:\n{state['feedback'][-600:]}"
                    ),
                ],
                config,
            )
            return {"query": extract_sql(text) or state["query"], "turns": state["turns"] + 1}

        def after_check(state: AgentState) -> Literal["rewriter", "__end__"]:
            return END if state["correct"] else "rewriter"

        def after_write(state: AgentState) -> Literal["checker", "__end__"]:
            return END if state["turns"] >= self.max_turns else "checker"

        builder = StateGraph(AgentState)
        builder.add_node("writer", writer)
        builder.add_node("checker", checker)
        builder.add_node("rewriter", rewriter)
        builder.add_edge(START, "writer")
        builder.add_conditional_edges("writer", after_write)  # the last query written is final: unchecked
        builder.add_conditional_edges("checker", after_check)
        builder.add_conditional_edges("rewriter", after_write)
        return builder.compile(name="spider_sql_agent")

    def __call__(self, task: dict[str, Any], llm: agl.LLM) -> float:
        """Run the graph on one Spider question, then score its final query against the gold query."""
        state: AgentState = self.graph(llm, task["db_path"]).invoke(
            {"question": task["question"], "schema": task["schema"]},
            config={"callbacks": [LightningCallback()], "recursion_limit": 4 * self.max_turns + 4},
        )
        correct = self._matches_gold(task, state["query"])
        first = state["first_query"]
        first_correct = correct if first == state["query"] else self._matches_gold(task, first)
        _harness.report(writer_acc=float(first_correct), turns=float(state["turns"]))
        return 1.0 if correct else 0.0

    def _matches_gold(self, task: dict[str, Any], sql: str) -> bool:
        return execution_match(task["db_path"], sql, task["query"], timeout_s=self.sql_timeout_s)
