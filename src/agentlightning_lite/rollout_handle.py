"""The handle of an open rollout (what ``with tracer.rollout()`` gives: its rewards, signals, prompts
and end), and the context variables that say which rollout and span are open in this task or thread.

:class:`~agentlightning_lite.tracer.Tracer` opens it; the names are importable from
:mod:`agentlightning_lite.span_handles` and :mod:`agentlightning_lite.tracer` too.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._json import dumps
from .ids import new_span_id
from .store.rows import SpanRow
from .types import ROLLOUT_STATUSES, SPAN_KINDS, check_reward

if TYPE_CHECKING:
    from .span_handles import SpanHandle
    from .tracer import Tracer

__all__ = ["RolloutHandle", "instant_row", "rollout_var", "span_var"]

logger = logging.getLogger(__name__)

_now = time.time
_KINDS = frozenset(SPAN_KINDS)
_new_row = tuple.__new__  # SpanRow's own __new__, without its Python-level call

#: the rollout open in this task or thread (what :meth:`Tracer.current_rollout
#: <agentlightning_lite.tracer.Tracer.current_rollout>` reads)
rollout_var: contextvars.ContextVar[RolloutHandle | None] = contextvars.ContextVar(
    "agl_rollout", default=None
)
#: the innermost span open in this task or thread (what :meth:`Tracer.current_span
#: <agentlightning_lite.tracer.Tracer.current_span>` reads)
span_var: contextvars.ContextVar[SpanHandle | None] = contextvars.ContextVar("agl_span", default=None)


def instant_row(
    ro: RolloutHandle, kind: str, name: str, output: Any, attributes: dict[str, Any] | str, status: str
) -> SpanRow:
    """The row of a zero-length span (a reward, a signal, a prompt read) in ``ro``, under the current span.

    ``attributes``: a dict, or the compact JSON text of one (what the row holds) when the caller has it.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer(agl.MemoryStore())
    >>> with tracer.rollout(mode="train") as ro, tracer.span("agent", "solver", agent="solver"):
    ...     row = instant_row(ro, "custom", "note", "hi", {"n": 1}, "ok")
    >>> (row.kind, row.name, row.agent, row.output, row.start_time == row.end_time)
    ('custom', 'note', 'solver', '"hi"', True)
    """
    parent = span_var.get()
    if parent is not None and parent.rollout_id != ro.id:
        parent = None
    now = _now()
    return _new_row(
        SpanRow,
        (
            new_span_id(),
            ro.id,
            None if parent is None else parent.span_id,
            kind,
            name,
            None if parent is None else parent.agent,
            now,
            now,
            status,
            None,
            "null",
            dumps(output),
            attributes if type(attributes) is str else dumps(attributes),
            None,
            None,
            None,
            None,
        ),
    )


class RolloutHandle:
    """An open rollout: its ``id``, and ``reward(value)`` to set the episode's final reward.

    On a normal exit the rollout is marked ``succeeded``; if an exception escapes, it is marked
    ``failed`` with the error recorded, and the exception is re-raised. The handle owns what the
    rollout records while it runs: its rewards (:meth:`record_reward`), its other zero-length spans
    (:meth:`record_instant`: signals, prompt reads), the prompts it was given (:attr:`prompts`) and its
    end (:meth:`finish`; :meth:`give_up` when it was ended from outside). Once it has ended, what is
    recorded through it is dropped (and logged).

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer(agl.MemoryStore())
    >>> with tracer.rollout("2+2?", metadata={"prompts": {"system": "Be brief."}}) as ro:
    ...     ro.record_reward(0.5, name="format")
    ...     ro.record_instant("signal", "checked", output=4)
    ...     ro.reward(1.0)
    ...     dict(ro.prompts)
    True
    {'system': 'Be brief.'}
    >>> [(s.kind, s.name) for s in tracer.store.spans(ro.id)]
    [('reward', 'format'), ('signal', 'checked'), ('reward', 'reward')]
    >>> tracer.store.get_rollout(ro.id).reward
    1.0
    """

    def __init__(self, tracer: Tracer, rollout_id: str, created: bool) -> None:
        self.tracer = tracer
        self.id = rollout_id
        self._created = created
        self._token: contextvars.Token[RolloutHandle | None] | None = None
        self._span_token: contextvars.Token[SpanHandle | None] | None = None
        self._lock = threading.Lock()
        self._final: float | None = None
        self._last_reward: tuple[float, SpanRow] | None = None  # (value, row)
        self._finished = False  # finished here, or ended from outside (give_up)
        self._warned = False
        self._prompts: dict[str, str] | None = None  # the given prompt texts, once read
        self._once: set[str] | None = None  # the ``once`` keys of record_instant so far

    def reward(self, value: float, name: str | None = None) -> None:
        """Set the final reward of this rollout (raises ``ValueError`` for NaN, inf or ``None``)."""
        self.record_reward(value, name, final=True)

    def record_reward(self, value: float, name: str | None = None, final: bool = False) -> None:
        """Record a reward span in this rollout: an intermediate reward, or with ``final`` the episode's.

        What :func:`~agentlightning_lite.tracer.emit_reward` does for the current rollout. If the
        rollout ends with no final reward set, its last reward becomes the final one. NaN, inf and
        ``None`` raise ``ValueError``; a reward recorded after the rollout ended is dropped (logged).

        >>> import agentlightning_lite as agl
        >>> tracer = agl.Tracer()
        >>> with tracer.rollout("task") as ro:
        ...     ro.record_reward(0.25, name="format")
        >>> ro.final_reward, tracer.store.get_rollout(ro.id).reward
        (0.25, 0.25)
        """
        checked = check_reward(value)
        if checked is None:
            raise ValueError("reward must be a finite number, got None")
        if self._finished and self._closed(f"reward {checked!r}"):  # _finished only ever turns True
            return
        # ``checked`` is a finite float: its attributes' JSON text, as dumps writes it
        attrs = f'{{"reward":{checked!r},"final":{"true" if final else "false"}}}'
        row = instant_row(self, "reward", name or "reward", checked, attrs, "ok")
        self.tracer.store.add_span_rows([row])
        with self._lock:
            if final:
                self._final = checked
            else:
                self._last_reward = (checked, row)

    def record_instant(
        self,
        kind: str,
        name: str,
        output: Any = None,
        attributes: dict[str, Any] | None = None,
        status: str = "ok",
        once: str | None = None,
    ) -> bool:
        """Record a zero-length span (a signal, a prompt read...) in this rollout, under the current
        span; return whether it was recorded.

        ``once``: a key; only the first call with it records (a prompt read is recorded once per
        rollout). Nothing is recorded after the rollout ended (the drop is logged). Rewards go through
        :meth:`record_reward`; a ``kind`` that is not a span kind, or ``reward``, raises ``ValueError``.

        >>> import agentlightning_lite as agl
        >>> tracer = agl.Tracer()
        >>> with tracer.rollout("task") as ro:
        ...     [ro.record_instant("custom", "read", "text", once="system") for _ in range(2)]
        [True, False]
        """
        if kind not in _KINDS or kind == "reward":
            what = "use record_reward for a reward" if kind == "reward" else f"one of {SPAN_KINDS}"
            raise ValueError(f"an instant span's kind must be {what}, got {kind!r}")
        if status not in ("ok", "error"):
            raise ValueError(f"span status must be 'ok' or 'error', got {status!r}")
        if once is not None:
            with self._lock:
                seen = self._once
                if seen is None:
                    seen = self._once = set()
                if once in seen:
                    return False
                seen.add(once)
        if self._closed(f"{kind} {name!r}" if once is None else f"{kind} {name!r} ({once})"):
            return False
        self.tracer.store.add_span_rows([instant_row(self, kind, name, output, attributes or {}, status)])
        return True

    @property
    def final_reward(self) -> float | None:
        """The final reward set so far (explicitly, or the last one emitted)."""
        with self._lock:
            if self._final is not None:
                return self._final
            return None if self._last_reward is None else self._last_reward[0]

    @property
    def prompts(self) -> Mapping[str, str]:
        """The prompt texts this rollout was given (its ``metadata["prompts"]``, ``{component: text}``;
        empty when none), read from the store on first use (what ``agl.prompt`` reads)."""
        given = self._prompts
        if given is None:
            rollout = self.tracer.store.get_rollout(self.id)
            meta = rollout.metadata if rollout is not None else {}
            raw = meta.get("prompts") if isinstance(meta, dict) else None
            given = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
            self._prompts = given
        return given

    def give_up(self) -> bool:
        """The rollout was ended from outside (timed out): this handle writes nothing more to it.

        Rewards and signals recorded through it afterwards are dropped, and leaving it neither
        finishes the rollout nor marks an emitted reward final. Returns whether it was still open
        (``False``: the agent finished it first).

        >>> import agentlightning_lite as agl
        >>> tracer = agl.Tracer()
        >>> with tracer.rollout("task") as ro:
        ...     tracer.store.close_rollout(ro.id, status="timeout")  # a trainer's timeout
        ...     ro.give_up(), ro.give_up()
        (True, False)
        >>> tracer.store.get_rollout(ro.id).status
        'timeout'
        """
        with self._lock:
            was_open, self._finished = not self._finished, True
        return was_open

    def _closed(self, what: str) -> bool:
        """Whether the rollout has ended, so ``what`` is dropped (logged once per handle)."""
        with self._lock:
            if not self._finished:
                return False
            first, self._warned = not self._warned, True
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "dropped %s for rollout %s: the rollout has ended (an agent that goes on past its "
            "rollout writes nothing into it)",
            what,
            self.id,
        )
        return True

    def finish(self, error: str | None = None, status: str | None = None) -> None:
        """End the rollout in the store: ``succeeded`` without ``error``, else ``failed`` (or ``status``:
        ``"timeout"``...). With no final reward set, the last emitted reward becomes the final one.

        Leaving the ``with`` block calls it; once the rollout has ended (finished here, or given up),
        a call does nothing. An unknown ``status`` raises ``ValueError``.

        >>> import agentlightning_lite as agl
        >>> tracer = agl.Tracer()
        >>> ro = tracer.rollout("task")
        >>> ro.record_reward(0.5)
        >>> ro.finish(status="timeout")
        >>> r = tracer.store.get_rollout(ro.id)
        >>> r.status, r.reward
        ('timeout', 0.5)
        """
        if status is not None and (status not in ROLLOUT_STATUSES or status == "running"):
            raise ValueError(f"status must be one of succeeded/failed/timeout, got {status!r}")
        with self._lock:
            if self._finished:
                return
            self._finished = True
            final, last = self._final, self._last_reward
        if final is None and last is not None:
            # no explicit final reward: the last emitted reward is the episode's reward
            final, row = last
            attrs = dumps({"reward": final, "final": True})
            self.tracer.store.add_span_rows([row._replace(attributes=attrs)])
        if status is None:
            status = "succeeded" if error is None else "failed"
        # a rollout marked timeout by a trainer while this agent ran on stays as it was
        self.tracer.store.close_rollout(self.id, status, final, error, not self._created)

    def __enter__(self) -> RolloutHandle:
        self._token = rollout_var.set(self)
        if span_var.get() is not None:  # spans inside start a fresh tree
            self._span_token = span_var.set(None)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is None:
                self.finish(None)
            elif isinstance(exc, TimeoutError):
                self.finish(f"{type(exc).__name__}: {exc}", status="timeout")
            else:
                self.finish(f"{type(exc).__name__}: {exc}")
        finally:
            if self._span_token is not None:
                span_var.reset(self._span_token)
            elif span_var.get() is not None:  # a span left open inside: spans after it start afresh
                span_var.set(None)
            if self._token is not None:
                rollout_var.reset(self._token)

    async def __aenter__(self) -> RolloutHandle:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<RolloutHandle {self.id}>"
