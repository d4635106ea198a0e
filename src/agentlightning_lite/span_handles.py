"""The handles of an open rollout and span (what ``with tracer.rollout()`` and ``tracer.span()``
give), and the context variables that say which ones are open in this task or thread.

:class:`~agentlightning_lite.tracer.Tracer` opens them and writes what they record into its store;
both names are importable from :mod:`agentlightning_lite.tracer` too.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from ._json import dumps
from .ids import new_span_id
from .store.rows import SpanRow
from .types import SPAN_KINDS, Span, SpanKind, SpanStatus, check_reward

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["RolloutHandle", "SpanHandle", "instant_row", "rollout_var", "span_var"]

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


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


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


class SpanHandle:
    """An open span. Set its output, attributes or tokens; it is written to the store on exit.

    Use it through ``with tracer.span(...) as sp:``, or call ``end()`` yourself after
    ``tracer.start_span(...)`` (callback-style integrations).
    """

    __slots__ = (
        "_activate",
        "_ended",
        "_owner",
        "_token",
        "_tracer",
        "agent",
        "attributes",
        "error",
        "input",
        "kind",
        "model",
        "name",
        "output",
        "parent_id",
        "prompt_token_ids",
        "response_logprobs",
        "response_token_ids",
        "rollout_id",
        "span_id",
        "start_time",
        "status",
    )
    _tracer: Tracer
    span_id: str
    rollout_id: str
    agent: str | None

    def __init__(
        self,
        tracer: Tracer,
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
    ) -> None:
        # what Tracer.start_span documents: parent, rollout and agent default to the context's
        if kind not in _KINDS:
            raise ValueError(f"span kind must be one of {SPAN_KINDS}, got {kind!r}")
        parent = span_var.get()
        owner: RolloutHandle | None = None
        if rollout_id is None:
            if parent is not None and parent._tracer is tracer:
                rollout_id = parent.rollout_id
            else:
                current = rollout_var.get()
                if current is not None:
                    rollout_id = current.id
                else:  # no rollout open: this span opens an implicit one and closes it
                    rollout_id = tracer.store.open_rollout(None, "trace", None, None)
                    owner = RolloutHandle(tracer, rollout_id, created=True)
        if parent_id is None and parent is not None and parent.rollout_id == rollout_id:
            parent_id = parent.span_id
            if agent is None:
                agent = parent.agent
        self._tracer = tracer
        self._token: contextvars.Token[SpanHandle | None] | None = None
        self._ended = False
        self._activate = activate
        self._owner = owner  # an implicit rollout this span opened and must close
        self.span_id = span_id or new_span_id()
        self.rollout_id = rollout_id
        self.parent_id = parent_id
        self.kind: SpanKind = kind  # type: ignore[assignment]  # checked against SPAN_KINDS above
        self.name = name
        self.agent = agent
        self.start_time = _now() if start_time is None else start_time
        self.input = input
        self.output: Any = None
        self.attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self.model = model
        self.prompt_token_ids: list[int] | None = None
        self.response_token_ids: list[int] | None = None
        self.response_logprobs: list[float] | None = None
        self.status: SpanStatus = "ok"
        self.error: str | None = None

    @property
    def id(self) -> str:
        """The span id."""
        return self.span_id

    def set_output(self, value: Any) -> None:
        """Record what the span produced."""
        self.output = value

    def set_attribute(self, key: str, value: Any) -> None:
        """Record one attribute (any JSON-able value; others are stored in readable form)."""
        self.attributes[key] = value

    def set_attributes(self, values: dict[str, Any]) -> None:
        """Record several attributes."""
        self.attributes.update(values)

    def set_tokens(
        self,
        prompt_token_ids: list[int] | None = None,
        response_token_ids: list[int] | None = None,
        response_logprobs: list[float] | None = None,
        model: str | None = None,
    ) -> None:
        """Record the engine's exact token ids and logprobs of an LLM call."""
        if prompt_token_ids is not None:
            self.prompt_token_ids = list(prompt_token_ids)
        if response_token_ids is not None:
            self.response_token_ids = list(response_token_ids)
        if response_logprobs is not None:
            self.response_logprobs = list(response_logprobs)
        if model is not None:
            self.model = model

    def set_error(self, error: BaseException | str) -> None:
        """Mark the span failed with ``error`` (an exception or a message)."""
        self.status = "error"
        self.error = error if isinstance(error, str) else _error_text(error)

    def to_span(self, end_time: float | None = None) -> Span:
        """The span as a :class:`~agentlightning_lite.Span` record (payloads copied, JSON-safe)."""
        return Span(
            span_id=self.span_id,
            rollout_id=self.rollout_id,
            parent_id=self.parent_id,
            kind=self.kind,
            name=self.name,
            agent=self.agent,
            start_time=self.start_time,
            end_time=end_time,
            status=self.status,
            error=self.error,
            input=self.input,
            output=self.output,
            attributes=self.attributes,
            model=self.model,
            prompt_token_ids=self.prompt_token_ids,
            response_token_ids=self.response_token_ids,
            response_logprobs=self.response_logprobs,
        )

    def end(
        self, output: Any = None, error: BaseException | str | None = None, end_time: float | None = None
    ) -> None:
        """Close the span (once) and write it to the store (``end_time``: epoch seconds, default now)."""
        if self._ended:
            raise RuntimeError(f"span {self.name!r} ({self.span_id}) ended twice")
        if output is not None:
            self.output = output
        if error is not None:
            self.set_error(error)
        self._close(_now() if end_time is None else end_time)

    def _close(self, end_time: float) -> None:
        self._ended = True
        # the row encodes the payloads now: later changes to the agent's objects are not recorded
        inp, out, attrs = self.input, self.output, self.attributes
        self._tracer.store.add_span_rows(
            (
                _new_row(
                    SpanRow,
                    (
                        self.span_id,
                        self.rollout_id,
                        self.parent_id,
                        self.kind,
                        self.name,
                        self.agent,
                        self.start_time,
                        end_time,
                        self.status,
                        self.error,
                        "null" if inp is None else dumps(inp),
                        "null" if out is None else dumps(out),
                        dumps(attrs) if attrs else "{}",
                        self.model,
                        self.prompt_token_ids,
                        self.response_token_ids,
                        self.response_logprobs,
                    ),
                ),
            )
        )
        token = self._token
        if token is not None:
            self._token = None
            try:
                span_var.reset(token)
            except ValueError:  # ended from another context: nothing to restore there
                pass
        if self._owner is not None:
            self._owner._finish(None if self.status == "ok" else self.error)

    def __enter__(self) -> SpanHandle:
        if self._activate:
            self._token = span_var.set(self)
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is not None:
            self.set_error(exc)
        if not self._ended:
            self._close(_now())

    async def __aenter__(self) -> SpanHandle:
        return self.__enter__()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.__exit__(exc_type, exc, tb)

    def __repr__(self) -> str:
        return f"<SpanHandle {self.kind}:{self.name} {self.span_id}>"


class RolloutHandle:
    """An open rollout: its ``id``, and ``reward(value)`` to set the episode's final reward.

    On a normal exit the rollout is marked ``succeeded``; if an exception escapes, it is marked
    ``failed`` with the error recorded, and the exception is re-raised.
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
        self._finished = False  # finished here, or ended from outside (_give_up)
        self._warned = False

    def reward(self, value: float, name: str | None = None) -> None:
        """Set the final reward of this rollout (raises ``ValueError`` for NaN/inf)."""
        value = check_reward(value)  # type: ignore[assignment]
        self.tracer._record_reward(self, value, name, final=True)

    @property
    def final_reward(self) -> float | None:
        """The final reward set so far (explicitly, or the last one emitted)."""
        with self._lock:
            if self._final is not None:
                return self._final
            return None if self._last_reward is None else self._last_reward[0]

    def _give_up(self) -> bool:
        """The rollout was ended from outside (timed out): this handle writes nothing more to it.

        Rewards and signals recorded through it afterwards are dropped, and leaving it neither
        finishes the rollout nor marks an emitted reward final. Returns whether it was still open
        (``False``: the agent finished it first).
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

    def _finish(self, error: str | None, status: str | None = None) -> None:
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
                self._finish(None)
            elif isinstance(exc, TimeoutError):
                self._finish(_error_text(exc), status="timeout")
            else:
                self._finish(_error_text(exc))
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
