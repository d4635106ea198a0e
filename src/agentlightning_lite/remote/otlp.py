"""OTLP/HTTP trace payloads (protobuf or JSON) into :class:`Span` records, attributed to rollouts.

A span's rollout is, in order: its ``agentlightning.rollout_id`` attribute; its resource's
``agentlightning.rollout_id`` attribute; another span of the same OTel trace that names one (in
this request or an earlier one); the rollout given by the request (the ``X-Agl-Rollout-Id``
header or a ``/rollout/<id>/v1/traces`` URL). Spans with none are rejected by the trainer; a
trace-only server (``agl-lite serve``) files each such trace as a ``trace`` rollout of its own.
The GenAI semantic-convention mapping is :func:`agentlightning_lite.otel.from_otel`'s.

The HTTP side is shared by every server that takes OTLP: :func:`read_otlp` (body, content type,
decoding, 4xx on bad input), :func:`otlp_spans` (attribution) and :func:`otlp_response`. The
trainer's runner routes use them (with their lease checks), and :func:`otlp_routes` mounts them on a
plain PolicyServer (``agl-lite serve``).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..otel import from_otel
from ..types import Span
from .otlp_decode import OTelLike, OTLPError, decode_json, decode_protobuf

if TYPE_CHECKING:  # the HTTP helpers need the serve extra (starlette); decoding does not
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute

    from ..serving.server import PolicyServer

__all__ = [
    "OTLPError",
    "TraceRollouts",
    "decode_json",
    "decode_protobuf",
    "otlp_response",
    "otlp_routes",
    "otlp_spans",
    "read_otlp",
    "spans_from_otlp",
]

_PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
_LEASE_ATTR = "agentlightning.lease"  # the runner routes' lease token attribute

ROLLOUT_ATTR = "agentlightning.rollout_id"


class TraceRollouts:
    """Which rollout each OTel trace belongs to, remembered for the last ``size`` traces."""

    def __init__(self, size: int = 100_000) -> None:
        self.size = size
        self._map: OrderedDict[int, str] = OrderedDict()

    def get(self, trace_id: int) -> str | None:
        return self._map.get(trace_id)

    def set(self, trace_id: int, rollout_id: str) -> None:
        self._map[trace_id] = rollout_id
        self._map.move_to_end(trace_id)
        while len(self._map) > self.size:
            self._map.popitem(last=False)


def trace_rollout_id(trace_id: int) -> str:
    """The rollout a trace-only server files an OTel trace under when none of its spans names one:
    ``otel-`` and the 32 hex digits of the trace id (the same for every batch of the trace).

    >>> trace_rollout_id(0x0AF7651916CD43DD8448EB211C80319C)
    'otel-0af7651916cd43dd8448eb211c80319c'
    """
    return f"otel-{trace_id:032x}"


def _rollouts(
    spans: list[OTelLike], default: str | None, traces: TraceRollouts, own_rollouts: bool = False
) -> Iterator[tuple[OTelLike, str | None]]:
    # a span naming its rollout names it for its whole trace (children often carry no attribute)
    for s in spans:
        rid = s.attributes.get(ROLLOUT_ATTR) or s.resource.get(ROLLOUT_ATTR)
        if isinstance(rid, str) and rid:
            traces.set(s.context.trace_id, rid)
    for s in spans:
        rid = s.attributes.get(ROLLOUT_ATTR) or s.resource.get(ROLLOUT_ATTR)
        if not (isinstance(rid, str) and rid):
            rid = traces.get(s.context.trace_id) or default
        if rid is None and own_rollouts:  # not remembered: a later batch may still name its rollout
            rid = trace_rollout_id(s.context.trace_id)
        yield s, rid


def spans_from_otlp(
    spans: list[OTelLike],
    default_rollout: str | None = None,
    traces: TraceRollouts | None = None,
    own_rollouts: bool = False,
) -> list[Span]:
    """Convert decoded OTLP spans into :class:`Span` records of their rollouts.

    Raises :class:`OTLPError` when a span's rollout cannot be told (see the module docstring),
    unless ``own_rollouts``: then such a span's trace is its rollout (:func:`trace_rollout_id`).

    >>> body = {"resourceSpans": [{"resource": {"attributes": [
    ...     {"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-1"}}]},
    ...   "scopeSpans": [{"spans": [{"traceId": "0af7651916cd43dd8448eb211c80319c",
    ...     "spanId": "b7ad6b7169203331", "name": "execute_tool calculator",
    ...     "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000500000000",
    ...     "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
    ...                    {"key": "gen_ai.tool.name", "value": {"stringValue": "calculator"}}]}]}]}]}
    >>> [(s.rollout_id, s.kind, s.name, s.duration) for s in spans_from_otlp(decode_json(body))]
    [('ro-1', 'tool', 'calculator', 0.5)]
    """
    traces = traces if traces is not None else TraceRollouts()
    out = []
    for s, rid in _rollouts(spans, default_rollout, traces, own_rollouts):
        if rid is None:
            raise OTLPError(
                f"span {s.name!r} names no rollout, and this server only takes spans it can attribute "
                f"to a rollout: set the span or resource attribute {ROLLOUT_ATTR!r}, the "
                "X-Agl-Rollout-Id header, or export to /rollout/<id>/v1/traces"
            )
        s.attributes.pop(ROLLOUT_ATTR, None)
        parent = None if s.parent_span_id is None else format(s.parent_span_id, "016x")
        try:
            out.append(from_otel(s, rid, parent))
        except (TypeError, ValueError) as exc:
            raise OTLPError(f"span {s.name!r}: {exc}") from None
    return out


# -- HTTP: shared by the runner routes and agl-lite serve ------------------------------------------
async def read_otlp(request: Request, limit: int) -> tuple[list[OTelLike], str | None, bool]:
    """Read and decode one OTLP/HTTP export request.

    Returns the decoded spans, the rollout the request names (``/rollout/<id>/v1/traces`` or the
    ``X-Agl-Rollout-Id`` header; ``None`` when neither) and whether the body was protobuf (the
    answer is then protobuf too). Bad input is an ``APIError``: 413 over ``limit`` bytes, 415 for
    another content type, 400 ``invalid_otlp`` for a body that is not an export request.
    """
    from ..serving.errors import APIError
    from ..serving.routes.request import ROLLOUT_HEADER, read_body

    raw = await read_body(request, limit)
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    default = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)
    proto = ctype in _PROTOBUF_TYPES
    try:
        if proto:
            decoded = decode_protobuf(raw)
        elif ctype in ("application/json", ""):
            try:
                body = json.loads(raw) if raw else {}
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise OTLPError(f"invalid JSON: {exc}") from None
            except RecursionError:
                raise OTLPError("invalid JSON: nested too deeply") from None
            decoded = decode_json(body)
        else:
            raise APIError(
                415,
                f"unsupported content type {ctype!r}: use application/x-protobuf or application/json",
                code="unsupported_media_type",
            )
    except OTLPError as exc:
        raise APIError(400, str(exc), code="invalid_otlp") from None
    return decoded, default, proto


def otlp_spans(
    decoded: list[OTelLike], default: str | None, traces: TraceRollouts, own_rollouts: bool = False
) -> list[Span]:
    """:func:`spans_from_otlp` for a request: a span whose rollout cannot be told is a 400 (unless
    ``own_rollouts``, on a trace-only server)."""
    from ..serving.errors import APIError

    try:
        return spans_from_otlp(decoded, default, traces, own_rollouts)
    except OTLPError as exc:
        raise APIError(400, str(exc), code="invalid_otlp") from None


def otlp_response(proto: bool) -> Response:
    """The answer to an export: an empty ``ExportTraceServiceResponse`` (zero bytes in protobuf)."""
    from starlette.responses import Response

    from ..serving.errors import JSONResponse

    if proto:
        return Response(b"", media_type="application/x-protobuf")
    return JSONResponse({})


def otlp_routes(server: PolicyServer, known_size: int = 10_000) -> list[BaseRoute]:
    """``POST /v1/traces`` and ``/rollout/{rollout_id}/v1/traces`` for a PolicyServer on its own.

    What ``agl-lite serve`` mounts (through the server's ``extra_routes`` hook): the same decoding,
    API key check (401), body limit (413) and attribution as the trainer's runner routes. A rollout
    a span names that the store does not have is started there (mode ``trace``, metadata
    ``{"implicit": True, "source": "otlp"}``) and left running: a trace-only agent names its own
    rollouts. An OTel trace whose spans name no rollout at all (a stock exporter) is filed as a
    ``trace`` rollout of its own, ``otel-<trace id>`` (metadata also ``otel_trace_id``), as the chat
    route files a call that names no rollout; it is finished (``succeeded``, or ``failed`` when the
    root span's status is an error) once the trace's root span arrives. (The trainer keeps refusing
    such spans with a 400 that says why: it trains only on rollouts it handed out.) With
    ``server.settings.flush`` the spans are committed before the answer.
    """
    from starlette.concurrency import run_in_threadpool
    from starlette.routing import Route

    from ..serving.errors import APIError
    from ..serving.routes.request import check_auth

    store = server.store
    traces = TraceRollouts()
    known: OrderedDict[str, None] = OrderedDict()  # rollouts known to be in the store

    def ensure(rid: str, trace_id: str | None = None) -> None:
        if rid in known:
            known.move_to_end(rid)
            return
        if store.get_rollout(rid) is None:
            metadata: dict[str, Any] = {"implicit": True, "source": "otlp"}
            if trace_id is not None:
                metadata["otel_trace_id"] = trace_id
            try:
                store.start_rollout(None, mode="trace", metadata=metadata, rollout_id=rid)
            except ValueError:  # another request started it meanwhile
                if store.get_rollout(rid) is None:
                    raise
        known[rid] = None
        while len(known) > known_size:
            known.popitem(last=False)

    async def traces_in(request: Request) -> Response:
        check_auth(server, request)
        decoded, default, proto = await read_otlp(request, server.settings.max_body_bytes)
        for d in decoded:  # a runner's lease token (meaningless here): never stored
            d.attributes.pop(_LEASE_ATTR, None)
        own = {trace_rollout_id(d.context.trace_id) for d in decoded}
        spans = otlp_spans(decoded, default, traces, own_rollouts=True)
        for rid in {s.rollout_id for s in spans}:
            if not 0 < len(rid) <= 256:
                msg = f"rollout ids are 1 to 256 characters, got {rid[:40]!r}..."
                raise APIError(400, msg, param="rollout_id")
        version = int(server.engine.version)
        for s in spans:
            s.attributes.setdefault("weights_version", version)

        def write() -> None:
            for rid in {s.rollout_id for s in spans}:
                ensure(rid, rid.removeprefix("otel-") if rid in own else None)
            store.add_spans(spans)
            for s in spans:  # a trace filed as its own rollout ends with its root span
                if s.rollout_id in own and s.parent_id is None:
                    status = "failed" if s.status == "error" else "succeeded"
                    store.finish_rollout(s.rollout_id, status=status, only_if_running=True)
            if server.settings.flush:
                store.flush()

        await run_in_threadpool(write)
        return otlp_response(proto)

    return [
        Route("/v1/traces", traces_in, methods=["POST"]),
        Route("/rollout/{rollout_id}/v1/traces", traces_in, methods=["POST"]),
    ]
