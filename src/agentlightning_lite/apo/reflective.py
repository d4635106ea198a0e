"""The reflective dataset: what the reflection model reads about one component, built from the spans.

For each rollout of an evaluated batch and each component to improve, one record: the task, the calls
of that component's agent (the messages it was given and what it answered), the tool calls with their
results or error text, the signals and automatic intermediate rewards (AIR) of the trace, the reward and
how the rollout ended, and a one-paragraph ``Feedback`` that says it in words.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..air import AIRRule, IntermediateReward
from ..prompts import PROMPT_SPAN, split_key
from ..types import Rollout, Span

__all__ = ["rollout_record"]

MAX_TEXT = 1500  #: characters kept of one message, tool input or output
MAX_CALLS = 6  #: the last calls of the component's agent kept per rollout
MAX_MESSAGES = 4  #: the last messages of a call's input kept


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    s = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return (
        s
        if len(s) <= limit
        else s[: limit // 2] + f" [... {len(s) - limit} characters ...] " + s[-limit // 2 :]
    )


def _message(msg: Any) -> str:
    if not isinstance(msg, dict):
        return _text(msg)
    content = msg.get("content")
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in content)
    out = f"{msg.get('role', '?')}: {content if content is not None else ''}"
    if msg.get("tool_calls"):
        calls = [(c.get("function") or c) if isinstance(c, dict) else c for c in msg["tool_calls"]]
        out += " [tool calls: " + _text(calls, 500) + "]"
    return _text(out)


def _mine(span: Span, agent: str | None) -> bool:
    """Whether ``span`` belongs to ``agent``'s component (a tool span of no agent belongs to every one)."""
    if agent is None:
        return True
    return span.agent in (agent, None) if span.kind == "tool" else span.agent == agent


def rollout_record(
    component: str,
    rollout: Rollout | None,
    spans: Sequence[Span],
    task: Any,
    score: float,
    status: str,
    error: str | None,
    air: Sequence[AIRRule] | None = None,
) -> dict[str, Any]:
    """The reflective record of ``component`` (``"agent/name"`` or ``"name"``) in one rollout."""
    agent, _ = split_key(component)
    llm = sorted((s for s in spans if s.kind == "llm"), key=lambda s: s.start_time)
    calls = [s for s in llm if _mine(s, agent)]
    tools = [s for s in spans if s.kind == "tool" and _mine(s, agent)]
    signals = [s for s in spans if s.kind == "signal"]
    record: dict[str, Any] = {"Task": _text(task)}
    record["Calls"] = [
        {
            "Input": [_message(m) for m in (c.input if isinstance(c.input, list) else [c.input])][
                -MAX_MESSAGES:
            ],
            "Output": _message(c.output) if c.output is not None else f"(no answer: {c.error or c.status})",
        }
        for c in calls[-MAX_CALLS:]
    ]
    if not calls:
        record["Calls"] = f"(no model call was made by {'agent ' + agent if agent else 'the agent'})"
    if tools:
        record["Tool calls"] = [
            {"Tool": t.name, "Input": _text(t.input, 500)}
            | (
                {"Error": _text(t.error or t.output or "error", 800)}
                if t.status == "error"
                else {"Result": _text(t.output, 800)}
            )
            for t in tools
        ]
    if signals:
        record["Signals"] = [
            {
                "Name": s.name,
                "Value": _text(s.output, 300),
                "Status": s.attributes.get("signal_status") or s.status,
            }
            for s in signals
        ]
    rewards: list[IntermediateReward | str] = []
    for rule in air or ():
        try:
            rewards.extend(rule(spans, llm))
        except Exception as exc:  # a rule that cannot read this trace says so instead of stopping the run
            rewards.append(f"{type(rule).__name__}: {exc}")
    if rewards:
        record["Intermediate rewards"] = [
            r if isinstance(r, str) else {"Name": r.name, "Value": r.value, "Call": r.call_index}
            for r in rewards
        ]
    record["Score"] = score
    record["Feedback"] = _feedback(score, status, error, tools, rollout)
    return record


def _feedback(
    score: float, status: str, error: str | None, tools: Sequence[Span], rollout: Rollout | None
) -> str:
    parts = [f"The rollout scored {score:g} (higher is better)."]
    if status != "succeeded":
        how = "timed out" if status == "timeout" else "failed"
        parts.append(f"It {how}: {_text(error or 'no error recorded', 800)}")
    failed = [t for t in tools if t.status == "error"]
    for t in failed:
        parts.append(f"Tool {t.name!r} failed with: {_text(t.error or t.output or 'error', 800)}")
    if rollout is not None and rollout.reward is None and status == "succeeded":
        parts.append("The agent gave no reward.")
    return " ".join(parts)


def prompt_reads(spans: Sequence[Span]) -> dict[str, str | None]:
    """The components read in a rollout and their declared defaults (from the ``agl.prompt`` spans)."""
    return {
        str(s.attributes.get("component")): s.attributes.get("default")
        for s in spans
        if s.kind == "custom" and s.name == PROMPT_SPAN and s.attributes.get("component")
    }
