"""CrewAI (1.x) adapter: an event-bus listener that records crews, tasks, agents, LLM calls and tools.

Create ``LightningListener()`` once (CrewAI listeners register on construction), or call
:func:`instrument`; ``close()`` / ``uninstrument()`` removes the handlers from the bus.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from crewai.events import BaseEventListener, crewai_event_bus
from crewai.events.types.agent_events import (
    AgentExecutionCompletedEvent,
    AgentExecutionErrorEvent,
    AgentExecutionStartedEvent,
)
from crewai.events.types.crew_events import (
    CrewKickoffCompletedEvent,
    CrewKickoffFailedEvent,
    CrewKickoffStartedEvent,
)
from crewai.events.types.llm_events import LLMCallCompletedEvent, LLMCallFailedEvent, LLMCallStartedEvent
from crewai.events.types.task_events import TaskCompletedEvent, TaskFailedEvent, TaskStartedEvent
from crewai.events.types.tool_usage_events import (
    ToolUsageErrorEvent,
    ToolUsageFinishedEvent,
    ToolUsageStartedEvent,
)

from ..ids import new_span_id
from ..join import join_spans
from ..store.base import Store
from ..tracer import SpanHandle, Tracer
from ..types import Span
from ._common import Installed, Instrumentation, Recorder, message_dict
from ._crewai_spans import adopt_orphans, crew_event_ids

__all__ = ["LightningListener", "instrument", "uninstrument"]

logger = logging.getLogger(__name__)

#: At most this many CrewAI event ids are remembered (a crew's own are dropped when it ends; the
#: rest, reserved for parents this listener does not record, go oldest first past the limit).
_MAX_IDS = 50_000
#: At most this many ends handled before their starts, or starts skipped, are kept (oldest dropped).
_MAX_PENDING = 10_000
#: A crew whose end was handled before the ends of some of its spans waits at most this long for them.
FINISH_TIMEOUT_S = 10.0


class _End(NamedTuple):
    """What an end event says; kept when its handler runs before the start's, replayed then."""

    output: Any = None
    error: Any = None
    attributes: dict[str, Any] | None = None
    end_time: float | None = None
    crew: bool = False  #: the crew's own end: its rollout is joined by the crew's finishing pass
    rollout_id: str | None = None  #: the rollout open where the end was handled (stashed ends only)


def _put(d: dict[Any, Any], key: Any, value: Any, limit: int = _MAX_PENDING) -> None:
    if len(d) >= limit:
        del d[next(iter(d))]
    d[key] = value


def _ts(event: Any) -> float | None:
    ts = getattr(event, "timestamp", None)
    return ts.timestamp() if ts is not None else None


def _role(event: Any) -> str | None:
    role = getattr(event, "agent_role", None)
    if role:
        return str(role)
    for attr in ("agent", "from_agent"):
        agent = getattr(event, attr, None)
        if agent is not None and getattr(agent, "role", None):
            return str(agent.role)
    task = getattr(event, "task", None) or getattr(event, "from_task", None)
    agent = getattr(task, "agent", None)
    return str(agent.role) if agent is not None and getattr(agent, "role", None) else None


def _tool_name(tool: Any) -> Any:
    """``getattr(tool, "name", str(tool))`` without rendering ``str(tool)`` when the tool has a name."""
    name = getattr(tool, "name", _tool_name)
    return str(tool) if name is _tool_name else name


def _text(value: Any) -> Any:
    raw = getattr(value, "raw", None)
    if isinstance(raw, str):
        return raw
    return value if isinstance(value, (str, int, float, bool, dict, list)) or value is None else str(value)


def _llm_output(response: Any) -> Any:
    """CrewAI's LLM result (text, or a list of tool calls) as an OpenAI assistant message."""
    if isinstance(response, str):
        return {"role": "assistant", "content": response}
    if isinstance(response, list):
        calls = []
        for c in response:
            dump = getattr(c, "model_dump", None)
            d = c if isinstance(c, dict) else (dump() if callable(dump) else {"name": str(c)})
            fn = d.get("function")
            fn = fn if isinstance(fn, dict) else {}
            calls.append(
                {"id": d.get("id"), "name": fn.get("name", d.get("name")), "arguments": fn.get("arguments")}
            )
        return message_dict("assistant", None, calls)
    return _text(response)


class LightningListener(BaseEventListener):
    """A CrewAI event-bus listener that records each crew run into the rollout open where it was kicked off.

    Spans: the crew (``chain``), each task (``chain``), each agent execution (``agent``, named by
    the agent's ``role``), each LLM call (``llm``, with the response id for the join) and each tool
    use (``tool``: arguments, output, error or reported failure). Every span carries the role of
    the agent it belongs to. Handlers run in CrewAI's worker threads, possibly out of order, so
    span ids are reserved from CrewAI's event ids and the join runs when the crew finishes.

    >>> listener = LightningListener()  # doctest: +SKIP
    >>> with tracer.rollout("write a haiku") as ro:  # doctest: +SKIP
    ...     crew.kickoff()
    >>> listener.close()  # doctest: +SKIP
    """

    def __init__(self, tracer: Tracer | Store | None = None, join: bool = True) -> None:
        self.recorder = Recorder("crewai", tracer, join=join)
        self._ids: dict[str, str] = {}  # CrewAI event id -> span id
        self._early_ends: dict[Any, _End] = {}
        self._skipped: dict[Any, None] = {}  # started with no rollout open: their ends record nothing
        # rollout -> its ended crews (and when they ended), waiting for spans still open
        self._finishing: dict[str, list[tuple[SpanHandle, float]]] = {}
        self._closing: dict[str, int] = {}  # rollout -> spans being ended (written) right now
        self._lock = threading.Lock()
        self._finish_lock = threading.Lock()  # one crew's finishing pass at a time
        self._registered: list[tuple[type, Callable[..., Any]]] = []
        self._warned = False
        super().__init__()

    # -- registration -----------------------------------------------------------------------
    def setup_listeners(self, crewai_event_bus: Any) -> None:
        """Register the handlers (CrewAI calls this from ``__init__``)."""
        handlers: list[tuple[type, Callable[..., Any]]] = [
            (CrewKickoffStartedEvent, self._crew_started),
            (CrewKickoffCompletedEvent, self._crew_ended),
            (CrewKickoffFailedEvent, self._crew_ended),
            (TaskStartedEvent, self._task_started),
            (TaskCompletedEvent, self._ended),
            (TaskFailedEvent, self._ended),
            (AgentExecutionStartedEvent, self._agent_started),
            (AgentExecutionCompletedEvent, self._ended),
            (AgentExecutionErrorEvent, self._ended),
            (LLMCallStartedEvent, self._llm_started),
            (LLMCallCompletedEvent, self._llm_ended),
            (LLMCallFailedEvent, self._llm_ended),
            (ToolUsageStartedEvent, self._tool_started),
            (ToolUsageFinishedEvent, self._ended),
            (ToolUsageErrorEvent, self._ended),
        ]
        for event_type, handler in handlers:
            crewai_event_bus.on(event_type)(handler)
        self._registered = handlers

    def close(self) -> None:
        """Unregister every handler from the event bus (idempotent)."""
        for event_type, handler in self._registered:
            crewai_event_bus.off(event_type, handler)
        self._registered = []

    @staticmethod
    def flush(timeout: float = 30.0) -> bool:
        """Wait until CrewAI's event handlers (ours included) have run."""
        return crewai_event_bus.flush(timeout)

    # -- ids --------------------------------------------------------------------------------
    def _id(self, event_id: str | None) -> str | None:
        if event_id is None:
            return None
        with self._lock:
            sid = self._ids.get(event_id)
            if sid is None:
                if len(self._ids) >= _MAX_IDS:
                    for old in list(self._ids)[: _MAX_IDS // 2]:
                        del self._ids[old]
                sid = self._ids[event_id] = new_span_id()
            return sid

    def _start(
        self,
        event: Any,
        kind: str,
        name: str,
        agent: str | None,
        input: Any = None,
        attributes: dict[str, Any] | None = None,
        model: str | None = None,
        key: Any = None,
    ) -> None:
        key = key if key is not None else event.event_id
        if self.recorder.tracer is None and Tracer.current_rollout() is None:
            with self._lock:
                if self._early_ends.pop(key, None) is None:  # the end, when it comes, records nothing
                    _put(self._skipped, key, None)
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "agentlightning_lite crewai adapter: kickoff() ran with no rollout open, so the crew "
                    "is not recorded (kick it off inside `with tracer.rollout(...)`)",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        parent_event = getattr(event, "parent_event_id", None)
        parent_id = self._id(parent_event) if kind != "chain" or parent_event else None
        h = self.recorder.start(
            key,
            kind,
            name,
            agent=agent,
            input=input,
            attributes={"crewai.event_id": event.event_id, **(attributes or {})},
            model=model,
            start_time=_ts(event),
            parent_id=parent_id,
            span_id=self._id(event.event_id),
        )
        with self._lock:
            early = self._early_ends.pop(key, None)
            if early is None or h is None:
                return
            self._closing[h.rollout_id] = self._closing.get(h.rollout_id, 0) + 1
        self._close(key, h.rollout_id, early)  # the end event's handler ran first: replay it

    def _end(self, key: Any, end: _End) -> None:
        """Close the span of ``key``, or keep ``end`` for when its start is handled."""
        with self._lock:
            open_span = self.recorder.get(key)
            if open_span is None:
                if key in self._skipped:
                    del self._skipped[key]
                else:
                    current = Tracer.current_rollout()
                    _put(self._early_ends, key, end._replace(rollout_id=current.id if current else None))
                return
            rollout_id = open_span.rollout_id
            self._closing[rollout_id] = self._closing.get(rollout_id, 0) + 1
        self._close(key, rollout_id, end)

    def _close(self, key: Any, rollout_id: str, end: _End) -> None:
        """End an open span (its rollout's ``_closing`` count already raised, lowered here); a crew's
        end then waits in :meth:`_finish_when_closed` for the rest of its spans."""
        try:
            h = self.recorder.end(
                key,
                output=end.output,
                error=end.error,
                attributes=end.attributes,
                join=not end.crew,
                end_time=end.end_time,
            )
        finally:
            self._closed(rollout_id)
        if end.crew and h is not None:
            self._finish_when_closed(rollout_id, h)

    def _closed(self, rollout_id: str) -> None:
        """A span of ``rollout_id`` is written: finish the rollout's waiting crews if it was the last."""
        with self._lock:
            left = self._closing.pop(rollout_id) - 1
            if left:
                self._closing[rollout_id] = left
            waiting = rollout_id in self._finishing
        if waiting:
            self._finish_when_closed(rollout_id)

    # -- handlers ---------------------------------------------------------------------------
    def _crew_started(self, source: Any, event: CrewKickoffStartedEvent) -> None:
        self._start(event, "chain", event.crew_name or "crew", None, input=event.inputs)

    def _crew_ended(self, source: Any, event: Any) -> None:
        if isinstance(event, CrewKickoffFailedEvent):
            end = _End(error=event.error, end_time=_ts(event), crew=True)
        else:
            end = _End(
                output=_text(event.output),
                attributes={"total_tokens": event.total_tokens},
                end_time=_ts(event),
                crew=True,
            )
        self._end(event.started_event_id, end)

    def _finish_when_closed(self, rollout_id: str, crew: SpanHandle | None = None) -> None:
        """Finish the ended crews of a rollout once none of their spans is open or being written:
        CrewAI runs handlers in a thread pool, so a crew's end can be handled before the ends of its
        last task or agent. A crew waits at most :data:`FINISH_TIMEOUT_S` for them."""
        with self._lock:
            waiting = self._finishing.get(rollout_id)
            if waiting is None:
                if crew is None:
                    return
                waiting = self._finishing[rollout_id] = []
            if crew is not None:
                waiting.append((crew, time.time()))
            latest_end = max(ended for _, ended in waiting)
            busy = (
                self._closing.get(rollout_id)
                or self.recorder.open_in(rollout_id, started_before=latest_end)
                or any(e.rollout_id == rollout_id for e in self._early_ends.values())
            )
            if not busy:
                crews = [c for c, _ in self._finishing.pop(rollout_id)]
        if busy:
            if crew is not None:
                timer = threading.Timer(FINISH_TIMEOUT_S, self._finish_overdue, args=(rollout_id, crew))
                timer.daemon = True
                timer.start()
            return
        for c in crews:
            self._finish_run(c)

    def _finish_overdue(self, rollout_id: str, crew: SpanHandle) -> None:
        """The crew still waits after :data:`FINISH_TIMEOUT_S`: finish it without the spans still open."""
        with self._lock:
            waiting = self._finishing.get(rollout_id, [])
            if not any(c is crew for c, _ in waiting):
                return  # finished already
            waiting[:] = [(c, t) for c, t in waiting if c is not crew]
            if not waiting:
                del self._finishing[rollout_id]
        logger.warning(
            "agentlightning_lite: crew %r of rollout %s ended %.0f s ago with spans still open; "
            "joining without them",
            crew.name,
            rollout_id,
            FINISH_TIMEOUT_S,
        )
        self._finish_run(crew)

    def _finish_run(self, crew: SpanHandle) -> None:
        """After the crew's span ends: one read of the rollout's spans, the fixes of
        :meth:`_adopt_orphans` and the join (when on) applied to it, one write of what changed."""
        with self._finish_lock:
            self._finish_run_locked(crew)

    def _finish_run_locked(self, crew: SpanHandle) -> None:
        store = self.recorder.get_store(crew)
        try:
            spans = store.spans(crew.rollout_id)
        except Exception:  # tracing must never break the crew
            logger.exception("agentlightning_lite: reading the spans of rollout %s failed", crew.rollout_id)
            return
        fixed: dict[str, Span] = {}
        try:
            fixed = self._adopt_orphans(crew, spans)
        except Exception:  # tracing must never break the crew
            logger.exception("agentlightning_lite: re-parenting spans of rollout %s failed", crew.rollout_id)
            fixed = {}
        view = [fixed.get(s.span_id, s) for s in spans] if fixed else spans
        try:
            self._forget_ids(crew, spans, view)
        except Exception:  # tracing must never break the crew
            logger.exception("agentlightning_lite: forgetting the event ids of a crew failed")
        if self.recorder.join:
            try:
                fixed.update((s.span_id, s) for s in join_spans(view, mark_unjoined=True))
            except Exception:
                logger.exception(
                    "agentlightning_lite: joining LLM spans of rollout %s failed", crew.rollout_id
                )
        if fixed:
            try:
                store.add_spans(list(fixed.values()))
            except Exception:
                logger.exception(
                    "agentlightning_lite: writing the spans of rollout %s failed", crew.rollout_id
                )

    def _forget_ids(self, crew: SpanHandle, spans: list[Span], view: list[Span]) -> None:
        """Drop the event ids of a finished crew: its spans' and those reserved for their parents.

        ``spans``: the rollout's spans as read; ``view``: the same with orphans re-parented, so the
        crew's descendants are found by following parent ids down from the crew's span.
        """
        events, reserved = crew_event_ids(crew, spans, view)
        with self._lock:
            for event_id in events:
                self._ids.pop(event_id, None)
            if reserved:
                for event_id in [e for e, sid in self._ids.items() if sid in reserved]:
                    del self._ids[event_id]

    def _adopt_orphans(self, crew: SpanHandle, rollout_spans: list[Span]) -> dict[str, Span]:
        """See :func:`adopt_orphans`."""
        return adopt_orphans(crew, rollout_spans)

    def _task_started(self, source: Any, event: TaskStartedEvent) -> None:
        task = event.task
        name = getattr(task, "name", None) or event.task_name or "task"
        desc = getattr(task, "description", None)
        self._start(event, "chain", str(name), _role(event), input=desc)

    def _agent_started(self, source: Any, event: AgentExecutionStartedEvent) -> None:
        role = str(event.agent.role)
        tools = [_tool_name(t) for t in event.tools or ()]
        self._start(event, "agent", role, role, input=event.task_prompt, attributes={"tools": tools})

    def _llm_started(self, source: Any, event: LLMCallStartedEvent) -> None:
        tools = [(t.get("function") or t).get("name") for t in event.tools or () if isinstance(t, dict)]
        messages = event.messages
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        self._start(
            event,
            "llm",
            "llm_call",
            _role(event),
            input=messages,
            attributes={"tools": tools} if tools else None,
            model=event.model,
            key=("llm", event.call_id),
        )

    def _llm_ended(self, source: Any, event: Any) -> None:
        key = ("llm", event.call_id)
        if isinstance(event, LLMCallFailedEvent):
            self._end(key, _End(error=event.error, end_time=_ts(event)))
            return
        attrs = {"agl.response_id": event.response_id} if event.response_id else None
        self._end(key, _End(output=_llm_output(event.response), attributes=attrs, end_time=_ts(event)))

    def _tool_started(self, source: Any, event: ToolUsageStartedEvent) -> None:
        self._start(event, "tool", event.tool_name, _role(event), input=event.tool_args)

    def _ended(self, source: Any, event: Any) -> None:
        key = event.started_event_id
        if key is None:
            return
        error = getattr(event, "error", None)
        failure = getattr(event, "failure", None)
        if failure is not None and error is None:
            error = getattr(failure, "message", None) or str(failure)
        output = getattr(event, "output", None)
        error = str(error) if error is not None else None
        self._end(key, _End(output=_text(output), error=error, end_time=_ts(event)))


_installed = Installed("crewai")


def instrument(tracer: Tracer | Store | None = None, join: bool = True) -> Instrumentation:
    """Record every CrewAI crew run in this process: registers a :class:`LightningListener` on the bus.

    ``handle.uninstrument()`` (or :func:`uninstrument`) unregisters it.

    >>> from agentlightning_lite.adapters import crewai as agl_crewai
    >>> with agl_crewai.instrument() as handle:
    ...     handle.active
    True
    """
    listener = LightningListener(tracer, join=join)
    return _installed.add(listener, listener.close)


#: Remove every instrumentation :func:`instrument` installed and has not removed, the latest first.
uninstrument = _installed.uninstrument
