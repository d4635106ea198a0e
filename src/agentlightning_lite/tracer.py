"""The embedded tracer: rollouts and nested spans by context, rewards and signals from anywhere."""

from __future__ import annotations

import logging
import warnings
from typing import Any

from .ids import new_span_id as new_span_id  # importable from here too
from .span_handles import (  # importable from here too
    RolloutHandle,
    SpanHandle,
    rollout_var,
    span_var,
)
from .store.base import Store
from .store.memory import MemoryStore
from .types import ROLLOUT_MODES, check_reward

logger = logging.getLogger(__name__)


class Tracer:
    """Records rollouts and nested spans into a store.

    Spans nest by context (``contextvars``), so nesting follows ``asyncio`` tasks and threads
    started with a copied context. A span opened outside any rollout opens an implicit ``trace``
    rollout that closes with it.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer(agl.MemoryStore())
    >>> with tracer.rollout({"question": "What is 2+3?"}, mode="train") as ro:
    ...     with tracer.span("agent", "solver", agent="solver"):
    ...         with tracer.span("llm", "chat", input=[{"role": "user", "content": "2+3?"}]) as sp:
    ...             sp.set_output("5")
    ...     agl.emit_reward(1.0)
    >>> [(s.kind, s.name, s.agent) for s in tracer.store.spans(ro.id)]
    [('agent', 'solver', 'solver'), ('llm', 'chat', 'solver'), ('reward', 'reward', None)]
    >>> tracer.store.get_rollout(ro.id).reward
    1.0
    """

    def __init__(self, store: Store | None = None) -> None:
        self.store: Store = store if store is not None else MemoryStore()

    # -- rollouts -------------------------------------------------------------------------
    def rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> RolloutHandle:
        """Open a rollout for ``task``; use as ``with tracer.rollout(task) as ro:``.

        If ``rollout_id`` names a rollout already in the store (started by a trainer, say), the
        handle attaches to it instead of creating a new one.
        """
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
        if rollout_id is not None and self.store.get_rollout(rollout_id) is not None:
            return RolloutHandle(self, rollout_id, created=False)
        return RolloutHandle(self, self.store.open_rollout(task, mode, metadata, rollout_id), True)

    @staticmethod
    def current_rollout() -> RolloutHandle | None:
        """The rollout open in this context, or ``None``."""
        return rollout_var.get()

    @staticmethod
    def current_span() -> SpanHandle | None:
        """The innermost span open in this context, or ``None``."""
        return span_var.get()

    # -- spans ----------------------------------------------------------------------------
    def start_span(
        self,
        kind: str,
        name: str,
        input: Any = None,
        agent: str | None = None,
        attributes: dict[str, Any] | None = None,
        model: str | None = None,
        parent_id: str | None = None,
        rollout_id: str | None = None,
        activate: bool = False,
        span_id: str | None = None,
        start_time: float | None = None,
    ) -> SpanHandle:
        """Open a span and return its handle; call ``handle.end()`` to record it.

        Parent, rollout and agent default to the current context's: a span without ``agent``
        inherits its parent's. For callback-style integrations pass ``parent_id``/``rollout_id``
        explicitly and keep ``activate=False`` (the span does not become the current one).
        """
        return SpanHandle(
            self,
            kind,
            name,
            input,
            agent,
            attributes,
            model,
            parent_id,
            rollout_id,
            activate,
            span_id,
            start_time,
        )

    def span(
        self,
        kind: str,
        name: str,
        input: Any = None,
        agent: str | None = None,
        attributes: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> SpanHandle:
        """Open a span nested in the current one: ``with tracer.span("tool", "search") as sp:``.

        An exception inside marks the span ``error`` (with the message) and propagates.
        """
        return SpanHandle(self, kind, name, input, agent, attributes, model, None, None, True)


_warned_outside: set[str] = set()


def _warn_outside(what: str) -> None:
    if what not in _warned_outside:
        _warned_outside.add(what)
        warnings.warn(
            f"agl.{what}() called outside a rollout: nothing was recorded",
            RuntimeWarning,
            stacklevel=3,
        )


def emit_reward(value: float, name: str | None = None, final: bool = False) -> None:
    """Record a reward in the current rollout, from anywhere in agent code.

    Rewards emitted during the episode are intermediate rewards (used by
    ``credit.Discounted``); ``final=True`` sets the episode's final reward. If a rollout ends
    with no final reward set, its last emitted reward becomes the final one. NaN and inf raise
    ``ValueError``. Outside a rollout, nothing is recorded (with a warning).

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("task") as ro:
    ...     agl.emit_reward(0.2, name="format")
    ...     agl.emit_reward(1.0, final=True)
    >>> tracer.store.get_rollout(ro.id).reward
    1.0
    """
    value = check_reward(value)  # type: ignore[assignment]
    if value is None:
        raise ValueError("reward must be a finite number, got None")
    ro = rollout_var.get()
    if ro is None:
        _warn_outside("emit_reward")
        return
    ro.record_reward(value, name, final=final)


def emit_signal(name: str, value: Any = None, status: str | None = None, **attributes: Any) -> None:
    """Record a system signal (a test passed, a tool failed, a format check...) in the rollout.

    Signals carry no reward by themselves; ``air.Rule`` turns them into intermediate rewards.
    ``status`` is free text; ``"error"``, ``"failed"`` and ``"failure"`` mark the span as an error.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("task") as ro:
    ...     agl.emit_signal("sql_executed", value=3, status="ok")
    >>> [(s.kind, s.name, s.output) for s in tracer.store.spans(ro.id)]
    [('signal', 'sql_executed', 3)]
    """
    ro = rollout_var.get()
    if ro is None:
        _warn_outside("emit_signal")
        return
    failed = status is not None and status.lower() in ("error", "failed", "failure")
    ro.record_instant(
        "signal", name, value, {"signal_status": status, **attributes}, "error" if failed else "ok"
    )
