"""The handle of an open span (what ``tracer.span()`` and ``tracer.start_span()`` give): its output,
attributes and tokens, written to the store when it ends.

:class:`~agentlightning_lite.tracer.Tracer` opens it; it is importable from
:mod:`agentlightning_lite.tracer` too, as are the names of :mod:`agentlightning_lite.rollout_handle`
(the rollout's handle and the context variables) re-exported here.
"""

from __future__ import annotations

import contextvars
import time
from typing import TYPE_CHECKING, Any

from ._json import dumps
from .ids import new_span_id
from .rollout_handle import RolloutHandle, instant_row, rollout_var, span_var
from .store.rows import SpanRow
from .types import SPAN_KINDS, Span, SpanKind, SpanStatus

if TYPE_CHECKING:
    from .tracer import Tracer

__all__ = ["RolloutHandle", "SpanHandle", "instant_row", "rollout_var", "span_var"]

_now = time.time
_KINDS = frozenset(SPAN_KINDS)
_new_row = tuple.__new__  # SpanRow's own __new__, without its Python-level call


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
        "tracer",
    )
    tracer: Tracer
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
            if parent is not None and parent.tracer is tracer:
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
        self.tracer = tracer
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
        self.error = error if isinstance(error, str) else f"{type(error).__name__}: {error}"

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
        self.tracer.store.add_span_rows(
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
            self._owner.finish(None if self.status == "ok" else self.error)

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
