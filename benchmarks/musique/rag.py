"""The MuSiQue RAG agent: an OpenAI Agents SDK agent that searches Wikipedia paragraphs, then answers.

One ``Agent`` named ``musique_rag`` with one function tool, ``search(query)``, which returns the
``top_k`` paragraphs of the split's corpus closest to the query, each cut to ``words`` words. One
worked example (:data:`DEMO`: a search, its result, an answer) precedes the question. The
agent may search several times; ``Runner.run(..., max_turns=max_turns)`` bounds its model calls, and
a run that is still searching at the limit gets no answer (reward 0). The final reply must hold
``<answer>...</answer>`` (see :mod:`.reward`). The model is the rollout's PolicyServer endpoint through
``OpenAIChatCompletionsModel``; the SDK's traces go to agentlightning-lite's ``LightningProcessor``
only (the SDK's exporter to OpenAI is replaced), so every model call becomes a transition.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunConfig,
    Runner,
    function_tool,
    set_trace_processors,
)
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError
from openai import AsyncOpenAI

import agentlightning_lite as agl
from agentlightning_lite.adapters.openai_agents import LightningProcessor

from .. import _harness
from .retriever import get_retriever
from .reward import score

__all__ = ["AGENT_NAME", "DEMO", "INSTRUCTIONS", "AgentConfig", "install_tracing", "make_agent", "rag_agent"]

AGENT_NAME = "musique_rag"
INSTRUCTIONS = (
    "Answer the question with facts from Wikipedia. Use the search tool to look up one fact at a time; "
    "questions often need two or more searches. When you know the answer, reply with only "
    "<answer>short answer</answer>."
)
#: one worked example before the question, as conversation items: search, read, answer in the format
DEMO: list[dict[str, Any]] = [
    {"role": "user", "content": "In which country was Marie Curie born?"},
    {
        "type": "function_call",
        "call_id": "call_demo",
        "name": "search",
        "arguments": json.dumps({"query": "Marie Curie birthplace"}),
    },
    {
        "type": "function_call_output",
        "call_id": "call_demo",
        "output": "[1] Marie Curie: Marie Curie was born in Warsaw, then part of the Russian Empire.\n"
        "[2] Warsaw: Warsaw is the capital and largest city of Poland.",
    },
    {"role": "assistant", "content": "<answer>Poland</answer>"},
]

_tracing_lock = threading.Lock()
_tracing_installed = False


def install_tracing() -> None:
    """Send the Agents SDK's traces to agentlightning-lite only (once per process).

    ``set_trace_processors`` replaces the SDK's default exporter, which would upload traces to
    OpenAI; the :class:`LightningProcessor` records each run into the current rollout.
    """
    global _tracing_installed
    with _tracing_lock:
        if not _tracing_installed:
            set_trace_processors([LightningProcessor()])
            _tracing_installed = True


@dataclass(frozen=True)
class AgentConfig:
    """How the agent searches and samples (the CPU defaults keep prompts short for a 135M model)."""

    retriever: str = "auto"  #: ``auto``, ``minilm``, ``bm25`` or a local embedding model directory
    scope: str = "pooled"  #: ``pooled``: the split's whole corpus; ``question``: its own 20 paragraphs
    top_k: int = 2  #: paragraphs per search
    words: int = 80  #: each paragraph cut to its first N words (0: whole)
    max_turns: int = 3  #: model calls per question (searches + the answer)
    max_tokens: int = 64  #: per model call
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.scope not in ("pooled", "question"):
            raise ValueError(f"scope must be 'pooled' or 'question', got {self.scope!r}")
        if self.top_k < 1 or self.max_turns < 1 or self.max_tokens < 1 or self.words < 0:
            raise ValueError(f"invalid agent settings: {self}")


async def rag_agent(task: dict[str, Any], llm: agl.LLM, config: AgentConfig = AgentConfig()) -> float:
    """Answer one MuSiQue question; returns ``0.1 * format + 0.9 * F1`` and reports ``em``, ``f1``,
    ``format``, ``support_recall`` (the share of the supporting paragraphs the searches found) and
    ``searches`` (search calls made)."""
    install_tracing()
    retriever = get_retriever(task["corpus"], config.retriever)
    among = task["paragraphs"] if config.scope == "question" else None
    found: set[int] = set()
    searches: list[str] = []

    @function_tool
    def search(query: str) -> str:
        """Search Wikipedia; returns the most relevant paragraphs.

        Args:
            query: what to look up, e.g. a person, place or event.
        """
        searches.append(query)
        hits = retriever.search(query, config.top_k, among)
        found.update(hits)
        return "\n".join(f"[{n}] {retriever.corpus.render(i, config.words)}" for n, i in enumerate(hits, 1))

    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    agent = Agent(
        name=AGENT_NAME,
        instructions=INSTRUCTIONS,
        tools=[search],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(max_tokens=config.max_tokens, temperature=config.temperature),
    )
    run_config = RunConfig(workflow_name="musique", trace_include_sensitive_data=True)
    try:
        question = [*DEMO, {"role": "user", "content": task["question"]}]
        result = await Runner.run(agent, question, max_turns=config.max_turns, run_config=run_config)
        reply = str(result.final_output or "")
    except (MaxTurnsExceeded, ModelBehaviorError):  # still searching at the limit, or a malformed call
        reply = ""
    finally:
        await client.close()
    s = score(reply, task["answers"])
    supporting = set(task.get("supporting") or ())
    _harness.report(
        em=s.em,
        f1=s.f1,
        format=s.format,
        support_recall=len(found & supporting) / len(supporting) if supporting else 0.0,
        searches=float(len(searches)),
    )
    return s.reward


def make_agent(**settings: Any) -> Callable[[dict[str, Any], agl.LLM], Awaitable[float]]:
    """An agent function ``(task, llm) -> reward`` with these :class:`AgentConfig` settings."""
    config = AgentConfig(**settings)

    async def agent(task: dict[str, Any], llm: agl.LLM) -> float:
        return await rag_agent(task, llm, config)

    agent.__doc__ = f"The MuSiQue RAG agent with {config}."
    return agent
