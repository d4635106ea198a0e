"""What every adapter shares: framework run ids mapped to open spans, the rollout to record into, the join.

Adapters see callbacks (start/end of a run, keyed by the framework's own id); :class:`Recorder` turns
them into tracer spans with the right parent, rollout and agent, and joins LLM spans with the
PolicyServer's token-level spans when the outermost span of a run ends.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..join import RESPONSE_ID, SOURCE, join_rollout
from ..store.base import Store
from ..tracer import SpanHandle, Tracer
from . import _tool_claims

__all__ = ["Installed", "Instrumentation", "Recorder", "as_tracer", "message_dict"]

logger = logging.getLogger(__name__)


def as_tracer(tracer: Tracer | Store | None) -> Tracer | None:
    """A tracer from a tracer, a store (wrapped in a new tracer) or ``None``.

    >>> import agentlightning_lite as agl
    >>> as_tracer(agl.MemoryStore()).__class__.__name__
    'Tracer'
    """
    if tracer is None or isinstance(tracer, Tracer):
        return tracer
    if isinstance(tracer, Store):
        return Tracer(tracer)
    raise TypeError(f"expected an agl.Tracer or an agl.Store, got {type(tracer).__name__}")


@dataclass
class _Open:
    handle: SpanHandle
    tracer: Tracer
    root: Any  # the key of the outermost open span of this run


class Recorder:
    """Open and close spans keyed by a framework's run ids; join LLM spans when a run's root ends.

    ``tracer`` fixes where spans go; with ``None`` they go to the rollout open in the caller's
    context (``with tracer.rollout(...)``), and nothing is recorded (one warning) when none is.
    A run started with no rollout open at all, but with a ``tracer``, gets an implicit rollout.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> rec = Recorder("demo", tracer)
    >>> with tracer.rollout("q") as ro:
    ...     _ = rec.start("run1", "agent", "solver", agent="solver")
    ...     _ = rec.start("llm1", "llm", "chat", parent_key="run1")
    ...     _ = rec.end("llm1", output="4")
    ...     _ = rec.end("run1")
    >>> [(s.kind, s.agent, s.attributes["agl.source"]) for s in tracer.store.spans(ro.id)]
    [('agent', 'solver', 'demo'), ('llm', 'solver', 'demo')]
    """

    def __init__(self, source: str, tracer: Tracer | Store | None = None, join: bool = True) -> None:
        self.source = source
        self.tracer = as_tracer(tracer)
        self.join = join
        self._open: dict[Any, _Open] = {}
        self._aliases: dict[Any, Any] = {}  # skipped runs -> their nearest recorded ancestor
        self._warned = False
        self._lock = threading.Lock()

    # -- lookup ---------------------------------------------------------------------------
    def resolve(self, key: Any) -> Any:
        """The recorded key ``key`` stands for (itself, or the ancestor of a skipped run)."""
        seen = 0
        while key in self._aliases and seen < 64:
            key = self._aliases[key]
            seen += 1
        return key

    def get(self, key: Any) -> SpanHandle | None:
        """The open span of ``key`` (or of the recorded ancestor a skipped run maps to)."""
        o = self._open.get(self.resolve(key))
        return None if o is None else o.handle

    def get_store(self, handle: SpanHandle) -> Store:
        """The store an open span is written to."""
        return handle.tracer.store

    def skip(self, key: Any, parent_key: Any) -> None:
        """Record nothing for run ``key``; its children attach to ``parent_key``'s span."""
        if parent_key is not None:
            self._aliases[key] = parent_key

    def forget(self, key: Any) -> None:
        """Drop the alias of a skipped run once it has ended."""
        self._aliases.pop(key, None)

    def _target(self) -> tuple[Tracer, str | None] | None:
        current = Tracer.current_rollout()
        tracer = self.tracer
        if tracer is None:
            if current is None:
                if not self._warned:
                    self._warned = True
                    warnings.warn(
                        f"agentlightning_lite {self.source} adapter: no rollout is open and no tracer was "
                        "given, so this run is not recorded (open one with `with tracer.rollout(...)`)",
                        RuntimeWarning,
                        stacklevel=4,
                    )
                return None
            return current.tracer, current.id
        if current is not None and current.tracer.store is tracer.store:
            return tracer, current.id
        return tracer, None  # no rollout of ours is open: the span opens an implicit one

    # -- spans ----------------------------------------------------------------------------
    def start(
        self,
        key: Any,
        kind: str,
        name: str,
        *,
        parent_key: Any = None,
        agent: str | None = None,
        input: Any = None,
        attributes: dict[str, Any] | None = None,
        model: str | None = None,
        start_time: float | None = None,
        parent_id: str | None = None,
        span_id: str | None = None,
    ) -> SpanHandle | None:
        """Open the span of run ``key`` under ``parent_key``'s span (or the current rollout).

        ``parent_id``/``span_id`` set the ids directly, for frameworks whose events can arrive out
        of order (a child before its parent): ids are then reserved from the framework's event ids.
        """
        parent = self._open.get(self.resolve(parent_key)) if parent_key is not None else None
        attrs = {SOURCE: self.source}
        if attributes:
            attrs.update(attributes)
        if parent is not None:
            ph = parent.handle
            h = parent.tracer.start_span(
                kind,
                name,
                input=input,
                agent=agent if agent is not None else ph.agent,
                attributes=attrs,
                model=model,
                parent_id=ph.span_id,
                rollout_id=ph.rollout_id,
                start_time=start_time,
                span_id=span_id,
            )
            self._open[key] = _Open(h, parent.tracer, parent.root)
            if kind == "tool":
                _tool_claims.add(h, parent.tracer.store)
            return h
        target = self._target()
        if target is None:
            return None
        tracer, rollout_id = target
        h = tracer.start_span(
            kind,
            name,
            input=input,
            agent=agent,
            attributes=attrs,
            model=model,
            rollout_id=rollout_id,
            start_time=start_time,
            parent_id=parent_id,
            span_id=span_id,
        )
        self._open[key] = _Open(h, tracer, key if parent_id is None else None)
        if kind == "tool":
            _tool_claims.add(h, tracer.store)
        return h

    def end(
        self,
        key: Any,
        output: Any = None,
        error: BaseException | str | None = None,
        attributes: dict[str, Any] | None = None,
        join: bool = True,
        end_time: float | None = None,
    ) -> SpanHandle | None:
        """Close the span of run ``key``; when it is the root of its run, join that rollout's LLM spans.

        ``join=False`` leaves the join to the caller (an adapter that reads the rollout's spans at the
        root's end anyway, and joins them in the same pass).
        """
        o = self._open.pop(key, None)
        if o is None:
            return None
        h = o.handle
        if h.kind == "tool":
            _tool_claims.remove(h)
        if attributes:
            h.attributes.update(attributes)
        h.end(output=output, error=error, end_time=end_time)
        if join and o.root == key and self.join:
            self.join_now(o.tracer.store, h.rollout_id)
        return h

    def join_now(self, store: Store, rollout_id: str) -> None:
        """Persist the join of one rollout's LLM spans (errors are logged, never raised into the agent)."""
        try:
            join_rollout(store, rollout_id)
        except Exception:  # the agent's run must not fail because of tracing
            logger.exception("agentlightning_lite: joining LLM spans of rollout %s failed", rollout_id)

    def set_response_id(self, key: Any, response_id: str | None) -> None:
        """Record the response id (``chatcmpl-...``) the framework saw for LLM run ``key``."""
        h = self.get(key)
        if h is not None and response_id:
            h.attributes[RESPONSE_ID] = response_id

    def open_in(self, rollout_id: str, started_before: float | None = None) -> bool:
        """Whether a span of rollout ``rollout_id`` (started before ``started_before``) is still open."""
        return any(
            o.handle.rollout_id == rollout_id
            and (started_before is None or o.handle.start_time <= started_before)
            for o in list(self._open.values())
        )

    def open_count(self) -> int:
        """How many spans are open (for tests: 0 after a run)."""
        return len(self._open)


class Instrumentation:
    """A handle on a zero-code instrumentation: ``uninstrument()`` (or leaving ``with``) undoes it.

    >>> undone = []
    >>> with Instrumentation("demo", handler=None, undo=lambda: undone.append(True)) as inst:
    ...     inst.active
    True
    >>> undone, inst.active
    ([True], False)
    """

    def __init__(self, framework: str, handler: Any, undo: Callable[[], None]) -> None:
        self.framework = framework
        self.handler = handler
        self._undo: Callable[[], None] | None = undo

    @property
    def active(self) -> bool:
        """Whether the instrumentation is still installed."""
        return self._undo is not None

    def uninstrument(self) -> None:
        """Remove the instrumentation (idempotent)."""
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    def __enter__(self) -> Instrumentation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstrument()

    def __repr__(self) -> str:
        return f"<Instrumentation {self.framework} {'active' if self.active else 'removed'}>"


class Installed:
    """The instrumentations an adapter module's ``instrument()`` installed and has not removed yet.

    :meth:`add` wraps what undoes one installation in an :class:`Instrumentation` that leaves this
    registry when it is removed; :meth:`uninstrument` removes all of them, the latest first (an
    installation that wrapped an earlier one is undone before it).

    >>> installed, undone = Installed("demo"), []
    >>> first = installed.add(None, lambda: undone.append(1))
    >>> second = installed.add(None, lambda: undone.append(2))
    >>> len(installed), installed.uninstrument(), undone, len(installed), first.active
    (2, None, [2, 1], 0, False)
    """

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self._active: list[Instrumentation] = []
        self._lock = threading.Lock()

    def add(self, handler: Any, undo: Callable[[], None]) -> Instrumentation:
        """Register one installation: ``handler`` is what it installed, ``undo`` removes it."""

        def remove() -> None:
            try:
                undo()
            finally:
                with self._lock:
                    if inst in self._active:
                        self._active.remove(inst)

        inst = Instrumentation(self.framework, handler, remove)
        with self._lock:
            self._active.append(inst)
        return inst

    def uninstrument(self) -> None:
        """Remove every instrumentation ``instrument()`` installed and has not removed, the latest first."""
        with self._lock:
            active = list(self._active)
        for inst in reversed(active):
            inst.uninstrument()

    def __len__(self) -> int:
        return len(self._active)

    def __repr__(self) -> str:
        return f"<Installed {self.framework}: {len(self)} active>"


def _tool_call_dict(tc: Any) -> dict[str, Any]:
    if isinstance(tc, dict):
        if "function" in tc:
            return tc
        args = tc.get("args", tc.get("arguments"))
        return {
            "id": tc.get("id"),
            "type": "function",
            "function": {"name": tc.get("name"), "arguments": args},
        }
    return {
        "id": getattr(tc, "id", None),
        "type": "function",
        "function": {"name": str(tc), "arguments": None},
    }


def message_dict(role: str, content: Any, tool_calls: Any = None, **extra: Any) -> dict[str, Any]:
    """An OpenAI-shaped chat message (``tool_calls`` normalised to ``{id, type, function}``).

    >>> message_dict("assistant", None, [{"name": "calc", "args": {"x": 1}, "id": "c1"}])["tool_calls"][0]
    {'id': 'c1', 'type': 'function', 'function': {'name': 'calc', 'arguments': {'x': 1}}}
    """
    msg: dict[str, Any] = {"role": role, "content": content}
    if tool_calls:
        msg["tool_calls"] = [_tool_call_dict(tc) for tc in tool_calls]
    msg.update({k: v for k, v in extra.items() if v is not None})
    return msg
