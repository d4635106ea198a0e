"""OpenTelemetry both ways: ingest OTel spans (GenAI conventions) into a store; export store spans.

OpenTelemetry stays optional: this module imports without it, and only the classes and functions
that touch OTel objects need ``opentelemetry-sdk`` (``pip install agentlightning-lite[otel]``).

* ``SpanProcessor(tracer)``: add it to an OTel ``TracerProvider``; every span any OTel
  instrumentation produces lands in the tracer's store, inside the agl rollout open where the span
  started (or an implicit ``trace`` rollout per OTel trace). GenAI semantic-convention attributes
  (``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.agent.name``,
  ``gen_ai.input.messages``, ``gen_ai.tool.name``...) map to span kind, model, agent, input, output.
* ``export(store, exporter)`` / ``MirrorStore(store, exporter)``: send the store's spans, as OTel
  spans with GenAI attributes, to any OTel ``SpanExporter`` (OTLP to Jaeger, Phoenix, Langfuse...).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Iterable
from typing import Any

from ._json import dumps, json_or_text
from .span_handles import span_var
from .store.base import Store
from .tracer import Tracer
from .types import Rollout, Span

try:  # OTel is optional
    from opentelemetry.sdk.trace import SpanProcessor as _OTelSpanProcessor
except ImportError:  # pragma: no cover - exercised only without the extra
    _OTelSpanProcessor = object  # type: ignore[assignment,misc]

__all__ = ["MirrorStore", "SpanProcessor", "export", "from_otel", "to_otel"]

_NS = 1_000_000_000
logger = logging.getLogger(__name__)

_PREFIX = "agentlightning."
_OP_TO_KIND = {
    "chat": "llm",
    "text_completion": "llm",
    "generate_content": "llm",
    "completion": "llm",
    "execute_tool": "tool",
    "invoke_agent": "agent",
    "create_agent": "agent",
}
_KIND_TO_OP = {"llm": "chat", "tool": "execute_tool", "agent": "invoke_agent"}


def _require_otel() -> None:
    try:
        import opentelemetry.sdk.trace  # noqa: F401
    except ImportError:
        raise ImportError(
            "OpenTelemetry support needs the SDK: pip install 'agentlightning-lite[otel]'"
        ) from None


def _indexed(attrs: dict[str, Any], prefix: str) -> list[dict[str, Any]] | None:
    """Legacy GenAI attributes ``gen_ai.prompt.0.role`` ... into a message list."""
    items: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if key.startswith(prefix):
            idx, _, field = key[len(prefix) :].partition(".")
            if idx.isdigit() and field:
                items.setdefault(int(idx), {})[field] = value
    return [items[i] for i in sorted(items)] or None


def _hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def _int_id(text: str, bits: int) -> int:
    width = bits // 4
    if len(text) == width:
        try:
            value = int(text, 16)
            if value:
                return value
        except ValueError:
            pass
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[: bits // 8], "big") or 1


def from_otel(otel_span: Any, rollout_id: str, parent_id: str | None = None) -> Span:
    """Convert one OTel ``ReadableSpan`` into a :class:`Span` of ``rollout_id``.

    Raises ``ValueError`` naming the span and the problem when its attributes cannot make a span
    (``agentlightning.prompt_token_ids`` that are not token ids, an unknown ``agentlightning.kind``...).
    """
    try:
        return _from_otel(otel_span, rollout_id, parent_id)
    except (ValueError, TypeError, OverflowError) as exc:
        name = getattr(otel_span, "name", "?")
        detail = str(exc).replace("\n", " ")
        raise ValueError(f"OTel span {name!r} cannot be recorded: {detail}") from None


def _from_otel(otel_span: Any, rollout_id: str, parent_id: str | None = None) -> Span:
    attrs = dict(otel_span.attributes or {})
    ctx = otel_span.context
    op = attrs.get("gen_ai.operation.name")
    # an attribute set by any exporter: Span validates it (one of SPAN_KINDS)
    kind: Any = attrs.pop(_PREFIX + "kind", None) or _OP_TO_KIND.get(str(op), "custom")
    if kind == "custom" and any(k.startswith(("gen_ai.prompt.", "gen_ai.completion.")) for k in attrs):
        kind = "llm"
    name = otel_span.name
    if kind == "tool":
        name = attrs.get("gen_ai.tool.name", name)
    agent = attrs.get("gen_ai.agent.name")
    model = attrs.get("gen_ai.response.model") or attrs.get("gen_ai.request.model")

    # spans exported by agentlightning-lite hold JSON in these fields; others may hold plain text,
    # so in theirs only objects and arrays are decoded
    foreign = _PREFIX + "span_id" not in attrs
    inp = attrs.get(_PREFIX + "input")
    if inp is None:
        inp = attrs.get("gen_ai.input.messages", attrs.get("gen_ai.tool.call.arguments"))
    inp = _indexed(attrs, "gen_ai.prompt.") if inp is None else json_or_text(inp, containers_only=foreign)
    out = attrs.get(_PREFIX + "output")
    if out is None:
        out = attrs.get("gen_ai.output.messages", attrs.get("gen_ai.tool.call.result"))
    out = _indexed(attrs, "gen_ai.completion.") if out is None else json_or_text(out, containers_only=foreign)

    extra = json_or_text(attrs.pop(_PREFIX + "attributes", None), containers_only=True)
    attributes: dict[str, Any] = {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.items() if not k.startswith(_PREFIX)
    }
    if isinstance(extra, dict):
        attributes.update(extra)
    if otel_span.attributes and "gen_ai.tool.call.id" in otel_span.attributes:
        attributes.setdefault("tool_call_id", otel_span.attributes["gen_ai.tool.call.id"])

    status_code = getattr(getattr(otel_span.status, "status_code", None), "name", "UNSET")
    error = None
    if status_code == "ERROR":
        error = otel_span.status.description or attrs.get("error.type")
        for ev in otel_span.events or ():
            if ev.name == "exception":
                ev_attrs = ev.attributes or {}
                error = error or (
                    f"{ev_attrs.get('exception.type', 'Exception')}: {ev_attrs.get('exception.message', '')}"
                )
        error = error or "error"

    def numbers(key: str, kind: type) -> list[Any] | None:
        v = attrs.get(_PREFIX + key)
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not all(isinstance(x, (int, float)) for x in v):
            raise ValueError(f"{_PREFIX}{key} must be a sequence of numbers, got {v!r}"[:300])
        return [kind(x) for x in v]

    def ints(key: str) -> list[int] | None:
        return numbers(key, int)

    logprobs = numbers("response_logprobs", float)
    return Span(
        span_id=attrs.get(_PREFIX + "span_id") or _hex_id(ctx.span_id, 16),
        rollout_id=rollout_id,
        parent_id=parent_id,
        kind=kind,
        name=name,
        agent=agent,
        start_time=(otel_span.start_time or 0) / _NS,
        end_time=None if otel_span.end_time is None else otel_span.end_time / _NS,
        status="error" if error else "ok",
        error=error,
        input=inp,
        output=out,
        attributes=attributes,
        model=model,
        prompt_token_ids=ints("prompt_token_ids"),
        response_token_ids=ints("response_token_ids"),
        response_logprobs=logprobs,
    )


class SpanProcessor(_OTelSpanProcessor):
    """An OTel span processor that records every finished OTel span into a tracer's store.

    The rollout of a span is, in order: its ``agentlightning.rollout_id`` attribute; the agl
    rollout open where the span started; its OTel parent's rollout; else one implicit ``trace``
    rollout per OTel trace, finished when the trace's root span ends.

    >>> import agentlightning_lite as agl
    >>> from opentelemetry.sdk.trace import TracerProvider
    >>> provider = TracerProvider()
    >>> tracer = agl.Tracer()
    >>> provider.add_span_processor(agl.otel.SpanProcessor(tracer))
    >>> otel_tracer = provider.get_tracer("demo")
    >>> with tracer.rollout("q") as ro:
    ...     with otel_tracer.start_as_current_span("chat smollm2") as s:
    ...         s.set_attribute("gen_ai.operation.name", "chat")
    ...         s.set_attribute("gen_ai.request.model", "smollm2-135m")
    >>> [(s.kind, s.model) for s in tracer.store.spans(ro.id)]
    [('llm', 'smollm2-135m')]
    """

    def __init__(self, tracer: Tracer) -> None:
        _require_otel()
        self.tracer = tracer
        self._lock = threading.Lock()
        self._started: dict[int, tuple[str, str | None]] = {}  # otel span id -> (rollout, parent)
        self._by_span: dict[int, str] = {}  # otel span id -> rollout id, for children
        self._trace_rollouts: dict[int, str] = {}  # implicit rollouts by otel trace id

    def _resolve(self, otel_span: Any) -> tuple[str, str | None]:
        attrs = otel_span.attributes or {}
        parent = otel_span.parent
        explicit = attrs.get(_PREFIX + "rollout_id")
        parent_id = _hex_id(parent.span_id, 16) if parent is not None else None
        if explicit is not None and not isinstance(explicit, str):
            raise ValueError(
                f"OTel span {otel_span.name!r} cannot be recorded: {_PREFIX}rollout_id must be a string, "
                f"got {explicit!r}"
            )
        if explicit:
            if self.tracer.store.get_rollout(explicit) is None:
                self.tracer.store.start_rollout(None, mode="trace", rollout_id=explicit)
            return explicit, attrs.get(_PREFIX + "parent_id", parent_id)
        with self._lock:
            if parent is not None and parent.span_id in self._by_span:
                return self._by_span[parent.span_id], parent_id
        current = self.tracer.current_rollout()
        if current is not None and current.tracer.store is self.tracer.store:
            if parent_id is None:
                agl_parent = span_var.get()
                if agl_parent is not None and agl_parent.rollout_id == current.id:
                    parent_id = agl_parent.span_id
            return current.id, parent_id
        trace_id = otel_span.context.trace_id
        with self._lock:
            rid = self._trace_rollouts.get(trace_id)
        if rid is None:
            ro = self.tracer.store.start_rollout(
                None, mode="trace", metadata={"otel_trace_id": _hex_id(trace_id, 32)}
            )
            rid = ro.rollout_id
            with self._lock:
                rid = self._trace_rollouts.setdefault(trace_id, rid)
        return rid, parent_id

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        try:
            resolved = self._resolve(span)
        except ValueError:  # reported once, when the span ends
            return
        with self._lock:
            self._started[span.context.span_id] = resolved
            self._by_span[span.context.span_id] = resolved[0]

    def _on_ending(self, span: Any) -> None:
        pass

    def on_end(self, span: Any) -> None:
        try:
            self._record(span)
        except ValueError as exc:  # never raise into the instrumented program
            logger.warning("agentlightning-lite dropped a span: %s", exc)

    def _record(self, span: Any) -> None:
        sid = span.context.span_id
        with self._lock:
            resolved = self._started.pop(sid, None)
        if resolved is None:
            resolved = self._resolve(span)
        rollout_id, parent_id = resolved
        problem: ValueError | None = None
        try:
            record: Span | None = from_otel(span, rollout_id, parent_id)
        except ValueError as exc:
            record, problem = None, exc
        if record is not None:
            self.tracer.store.add_spans([record])
        with self._lock:
            self._by_span.pop(sid, None)
            implicit = self._trace_rollouts.get(span.context.trace_id) == rollout_id
            if implicit and span.parent is None:
                del self._trace_rollouts[span.context.trace_id]
        if implicit and span.parent is None:
            self.tracer.store.finish_rollout(
                rollout_id,
                status="failed" if record is None or record.status == "error" else "succeeded",
                error=str(problem) if record is None else record.error,
            )
        if problem is not None:
            raise problem

    def ingest(self, otel_spans: Iterable[Any]) -> int:
        """Record already-finished OTel spans (from an exporter or a file); return the count.

        Raises ``ValueError`` at the first span that cannot be recorded (the spans before it are
        kept; that one is not written). A live processor (``on_end``) logs such a span and drops it.
        """
        n = 0
        for s in otel_spans:
            self._record(s)
            n += 1
        return n

    def shutdown(self) -> None:
        self.tracer.store.flush()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.tracer.store.flush()
        return True


def to_otel(span: Span, resource: Any = None) -> Any:
    """Convert a :class:`Span` into an OTel ``ReadableSpan`` with GenAI attributes.

    The OTel trace id is the rollout id (hashed if it is not 32 hex characters); the span id is the
    span id (likewise). ``agentlightning.*`` attributes keep what GenAI conventions have no slot
    for, so :func:`from_otel` gives the same span back.
    """
    _require_otel()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    trace_id = _int_id(span.rollout_id, 128)
    context = SpanContext(trace_id, _int_id(span.span_id, 64), False, TraceFlags(1))
    parent = (
        None
        if span.parent_id is None
        else SpanContext(trace_id, _int_id(span.parent_id, 64), False, TraceFlags(1))
    )
    attrs: dict[str, Any] = {
        _PREFIX + "rollout_id": span.rollout_id,
        _PREFIX + "span_id": span.span_id,
        _PREFIX + "kind": span.kind,
    }
    if span.parent_id is not None:
        attrs[_PREFIX + "parent_id"] = span.parent_id
    if span.kind in _KIND_TO_OP:
        attrs["gen_ai.operation.name"] = _KIND_TO_OP[span.kind]
    if span.agent is not None:
        attrs["gen_ai.agent.name"] = span.agent
    if span.model is not None:
        attrs["gen_ai.request.model"] = span.model
    if span.kind == "llm":
        attrs["gen_ai.input.messages"] = dumps(span.input)
        attrs["gen_ai.output.messages"] = dumps(span.output)
    elif span.kind == "tool":
        attrs["gen_ai.tool.name"] = span.name
        attrs["gen_ai.tool.call.arguments"] = dumps(span.input)
        attrs["gen_ai.tool.call.result"] = dumps(span.output)
        if "tool_call_id" in span.attributes:
            attrs["gen_ai.tool.call.id"] = str(span.attributes["tool_call_id"])
    else:
        attrs[_PREFIX + "input"] = dumps(span.input)
        attrs[_PREFIX + "output"] = dumps(span.output)
    if span.attributes:
        attrs[_PREFIX + "attributes"] = dumps(span.attributes)
    if span.prompt_token_ids is not None:
        attrs[_PREFIX + "prompt_token_ids"] = tuple(span.prompt_token_ids)
    if span.response_token_ids is not None:
        attrs[_PREFIX + "response_token_ids"] = tuple(span.response_token_ids)
    if span.response_logprobs is not None:
        attrs[_PREFIX + "response_logprobs"] = tuple(span.response_logprobs)
    status = Status(StatusCode.ERROR, span.error) if span.status == "error" else Status(StatusCode.OK)
    end = span.end_time if span.end_time is not None else span.start_time
    kind = SpanKind.CLIENT if span.kind == "llm" else SpanKind.INTERNAL
    return ReadableSpan(
        name=span.name,
        context=context,
        parent=parent,
        resource=resource
        if resource is not None
        else Resource.create({"service.name": "agentlightning-lite"}),
        attributes=attrs,
        kind=kind,
        status=status,
        start_time=int(span.start_time * _NS),
        end_time=int(end * _NS),
        instrumentation_scope=InstrumentationScope("agentlightning_lite"),
    )


def export(
    store: Store,
    exporter: Any,
    rollout_ids: Iterable[str] | None = None,
    mode: str | None = None,
) -> int:
    """Send the spans of the store's rollouts to an OTel ``SpanExporter``; return the span count.

    >>> import agentlightning_lite as agl
    >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("q"):
    ...     with tracer.span("tool", "search", input="cats"):
    ...         pass
    >>> exporter = InMemorySpanExporter()
    >>> agl.otel.export(tracer.store, exporter)
    1
    >>> exporter.get_finished_spans()[0].attributes["gen_ai.tool.name"]
    'search'
    """
    _require_otel()
    ids = [r.rollout_id for r in store.rollouts(mode=mode)] if rollout_ids is None else list(rollout_ids)
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": "agentlightning-lite"})
    n = 0
    for rid in ids:
        batch = [to_otel(s, resource) for s in store.spans(rid)]
        if batch:
            exporter.export(batch)
            n += len(batch)
    return n


class MirrorStore(Store):
    """A store that writes through to ``store`` and mirrors every span to an OTel exporter live.

    >>> import agentlightning_lite as agl
    >>> from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    >>> exporter = InMemorySpanExporter()
    >>> tracer = agl.Tracer(agl.otel.MirrorStore(agl.MemoryStore(), exporter))
    >>> with tracer.rollout("q"):
    ...     with tracer.span("llm", "chat", input="hi"):
    ...         pass
    >>> [s.name for s in exporter.get_finished_spans()]
    ['chat']
    """

    def __init__(self, store: Store, exporter: Any) -> None:
        _require_otel()
        self.inner = store
        self.exporter = exporter

    def add_spans(self, spans: Iterable[Span]) -> None:
        spans = list(spans)
        self.inner.add_spans(spans)
        if spans:
            self.exporter.export([to_otel(s) for s in spans])

    def spans(self, rollout_id: str) -> list[Span]:
        return self.inner.spans(rollout_id)

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        return self.inner.get_rollout(rollout_id)

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        return self.inner.rollouts(mode=mode, status=status)

    def rollout_for_update(self, rollout_id: str) -> Rollout | None:
        return self.inner.rollout_for_update(rollout_id)

    def insert_rollout(self, rollout: Rollout) -> None:
        self.inner.insert_rollout(rollout)

    def update_rollout(self, rollout: Rollout) -> None:
        self.inner.update_rollout(rollout)

    def flush(self) -> None:
        self.inner.flush()
        flush = getattr(self.exporter, "force_flush", None)
        if callable(flush):
            flush()

    def close(self) -> None:
        self.inner.close()
        self.exporter.shutdown()
