"""The CrewAI adapter's pass over a finished crew's spans: spans whose parent event is not recorded
re-parented, tool spans given the ids of the calls that asked for them, and the crew's event ids found
(to forget them)."""

from __future__ import annotations

from typing import Any

from .._toolcalls import PendingCalls
from ..join import SOURCE
from ..tracer import SpanHandle
from ..types import Span

__all__ = ["adopt_orphans", "crew_event_ids"]


def adopt_orphans(crew: SpanHandle, rollout_spans: list[Span]) -> dict[str, Span]:
    """Re-parent spans whose CrewAI parent event is one this listener does not record (memory,
    reasoning...): under the innermost recorded span of the same agent that encloses them.
    Also give tool spans the ``tool_call_id`` of the model's call that asked for them.
    Returns the changed copies by span id (``rollout_spans``: the rollout's spans as stored)."""
    spans = [  # this crew's: another crew of the rollout started before it, or after its end
        s
        for s in rollout_spans
        if s.attributes.get(SOURCE) == "crewai"
        and s.span_id != crew.span_id
        and s.start_time >= crew.start_time
    ]
    known = {s.span_id for s in spans} | {crew.span_id}
    inf = float("inf")
    fixed: dict[str, Any] = {}
    asked: dict[str | None, PendingCalls] = {}  # agent -> the tool calls its LLM calls asked for
    for s in spans:
        if s.kind == "llm":
            asked.setdefault(s.agent, PendingCalls()).add(s.output, s.end_time or s.start_time)
    for s in spans:
        if s.kind == "tool" and "tool_call_id" not in s.attributes and s.agent in asked:
            call = asked[s.agent].claim(s.name, s.input, started_at=s.start_time)
            if call is not None and call.id:
                fixed[s.span_id] = s.model_copy(
                    update={"attributes": {**s.attributes, "tool_call_id": call.id}}
                )
    for s in spans:
        if s.parent_id is None or s.parent_id in known:
            continue
        end = s.end_time if s.end_time is not None else s.start_time
        holders = [
            p
            for p in spans
            if p.kind in ("agent", "chain")
            and p.span_id != s.span_id
            and p.start_time <= s.start_time
            and (p.end_time if p.end_time is not None else inf) >= end
            and (p.agent == s.agent or s.agent is None)
        ]
        parent = max(holders, key=lambda p: p.start_time).span_id if holders else crew.span_id
        fixed[s.span_id] = fixed.get(s.span_id, s).model_copy(update={"parent_id": parent})
    return fixed


def crew_event_ids(crew: SpanHandle, spans: list[Span], view: list[Span]) -> tuple[set[Any], set[str]]:
    """The CrewAI event ids of a finished crew's spans, and the span ids reserved for parent events that
    are not recorded (memory, reasoning...) under them.

    ``spans``: the rollout's spans as read; ``view``: the same with orphans re-parented, so the
    crew's descendants are found by following parent ids down from the crew's span.
    """
    children: dict[str | None, list[Span]] = {}
    for s in view:
        children.setdefault(s.parent_id, []).append(s)
    events: set[Any] = {crew.attributes.get("crewai.event_id")}
    mine: set[str] = set()
    todo = [crew.span_id]
    while todo:
        for s in children.pop(todo.pop(), ()):
            events.add(s.attributes.get("crewai.event_id"))
            mine.add(s.span_id)
            todo.append(s.span_id)
    recorded = {s.span_id for s in spans}
    # ids reserved for parent events this listener does not record (memory, reasoning...)
    reserved = {
        s.parent_id for s in spans if s.span_id in mine and s.parent_id and s.parent_id not in recorded
    }
    return events, reserved
