"""OTLP trace export requests (protobuf or OTLP/JSON) decoded into the fields of OTel spans that
:func:`agentlightning_lite.otel.from_otel` reads; a payload that is not a valid request raises
:class:`OTLPError`."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidRequestError

__all__ = ["OTLPError", "OTelLike", "decode_json", "decode_protobuf"]


class OTLPError(InvalidRequestError):
    """A payload that is not a valid OTLP trace export request."""


@dataclass
class _Code:
    name: str


@dataclass
class _Status:
    status_code: _Code
    description: str | None = None


@dataclass
class _Context:
    span_id: int
    trace_id: int


@dataclass
class _Event:
    name: str
    attributes: dict[str, Any]


@dataclass
class OTelLike:
    """The fields of an OTel ``ReadableSpan`` that :func:`from_otel` reads, decoded from OTLP."""

    name: str
    context: _Context
    parent_span_id: int | None
    start_time: int
    end_time: int | None
    attributes: dict[str, Any]
    status: _Status
    events: list[_Event] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)


_STATUS_NAMES = {0: "UNSET", 1: "OK", 2: "ERROR"}


def _status_name(code: Any) -> str:
    if isinstance(code, str):
        return code.removeprefix("STATUS_CODE_") or "UNSET"
    if isinstance(code, int) and not isinstance(code, bool):
        return _STATUS_NAMES.get(code, "UNSET")
    return "UNSET"


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        raise OTLPError(f"{what} must be an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise OTLPError(f"{what} must be an integer, got {value!r}") from None


def _json_id(value: Any, what: str, nbytes: int) -> int | None:
    """An OTLP/JSON trace or span id: hex (the OTLP/JSON rule), or base64 (protobuf's JSON mapping)."""
    if value in (None, ""):
        return None
    if not isinstance(value, str):
        raise OTLPError(f"{what} must be a hex string, got {value!r}")
    if len(value) == 2 * nbytes:
        try:
            return int(value, 16)
        except ValueError:
            pass
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raise OTLPError(f"{what} must be {2 * nbytes} hex characters, got {value!r}") from None
    if len(raw) != nbytes:
        raise OTLPError(f"{what} must be {2 * nbytes} hex characters, got {value!r}")
    return int.from_bytes(raw, "big")


def _json_value(v: Any) -> Any:
    if not isinstance(v, dict):
        raise OTLPError(f"attribute values must be OTLP AnyValue objects, got {v!r}")
    if "stringValue" in v:
        return str(v["stringValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "intValue" in v:
        return _int(v["intValue"], "intValue")
    if "doubleValue" in v:
        try:
            return float(v["doubleValue"])
        except (TypeError, ValueError):
            raise OTLPError(f"doubleValue must be a number, got {v['doubleValue']!r}") from None
    if "arrayValue" in v:
        return [_json_value(x) for x in _obj(v["arrayValue"], "arrayValue").get("values") or []]
    if "kvlistValue" in v:
        return _json_attrs(_obj(v["kvlistValue"], "kvlistValue").get("values"))
    if "bytesValue" in v:
        return str(v["bytesValue"])
    return None


def _json_attrs(items: Any) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise OTLPError("attributes must be a list of {key, value}")
    out = {}
    for kv in items:
        if not isinstance(kv, dict) or not isinstance(kv.get("key"), str):
            raise OTLPError("attributes must be a list of {key, value}")
        out[kv["key"]] = _json_value(kv.get("value") or {})
    return out


def _list(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    if value is None:
        return []
    if not isinstance(value, list):
        raise OTLPError(f"{key!r} must be a list")
    return value


def _obj(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise OTLPError(f"{what} must be an object, got {value!r}"[:300])
    return value


def decode_json(body: Any) -> list[OTelLike]:
    """The spans of an OTLP/JSON ``ExportTraceServiceRequest`` (already JSON-decoded)."""
    try:
        return _decode_json(body)
    except (AttributeError, TypeError, KeyError, OverflowError) as exc:  # a shape not caught below
        raise OTLPError(f"malformed OTLP/JSON document: {type(exc).__name__}: {exc}") from None


def _decode_json(body: Any) -> list[OTelLike]:
    if not isinstance(body, dict):
        raise OTLPError("an OTLP/JSON body is an object with 'resourceSpans'")
    out = []
    for rs in _list(body, "resourceSpans"):
        resource = _json_attrs(
            _obj(_obj(rs, "a resourceSpans entry").get("resource"), "resource").get("attributes")
        )
        for ss in _list(rs, "scopeSpans") or _list(rs, "instrumentationLibrarySpans"):
            for sp in _list(ss, "spans"):
                if not isinstance(sp, dict):
                    raise OTLPError("each span must be an object")
                span_id = _json_id(sp.get("spanId"), "spanId", 8)
                trace_id = _json_id(sp.get("traceId"), "traceId", 16)
                if span_id is None or trace_id is None:
                    raise OTLPError("each span needs a traceId and a spanId")
                status = _obj(sp.get("status"), "status")
                end = sp.get("endTimeUnixNano")
                out.append(
                    OTelLike(
                        name=str(sp.get("name") or ""),
                        context=_Context(span_id, trace_id),
                        parent_span_id=_json_id(sp.get("parentSpanId"), "parentSpanId", 8),
                        start_time=_int(sp.get("startTimeUnixNano") or 0, "startTimeUnixNano"),
                        end_time=None if end in (None, 0, "0") else _int(end, "endTimeUnixNano"),
                        attributes=_json_attrs(sp.get("attributes")),
                        status=_Status(_Code(_status_name(status.get("code"))), status.get("message")),
                        events=[
                            _Event(str(e.get("name") or ""), _json_attrs(e.get("attributes")))
                            for e in _list(sp, "events")
                            if isinstance(e, dict)
                        ],
                        resource=resource,
                    )
                )
    return out


def _pb_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_pb_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, which)


def _pb_attrs(items: Any) -> dict[str, Any]:
    return {kv.key: _pb_value(kv.value) for kv in items}


def decode_protobuf(data: bytes) -> list[OTelLike]:
    """The spans of a protobuf ``ExportTraceServiceRequest`` (needs ``opentelemetry-proto``)."""
    try:
        from google.protobuf.message import DecodeError
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    except ImportError:  # pragma: no cover - the remote extra installs it
        raise OTLPError(
            "protobuf OTLP needs opentelemetry-proto on the trainer (pip install "
            "'agentlightning-lite[remote]'); or export OTLP/JSON"
        ) from None
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise OTLPError(f"not a protobuf ExportTraceServiceRequest: {exc}") from None
    out = []
    for rs in req.resource_spans:
        resource = _pb_attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if len(sp.span_id) != 8 or len(sp.trace_id) != 16:
                    raise OTLPError("each span needs a 16-byte traceId and an 8-byte spanId")
                out.append(
                    OTelLike(
                        name=sp.name,
                        context=_Context(
                            int.from_bytes(sp.span_id, "big"), int.from_bytes(sp.trace_id, "big")
                        ),
                        parent_span_id=int.from_bytes(sp.parent_span_id, "big")
                        if sp.parent_span_id
                        else None,
                        start_time=sp.start_time_unix_nano,
                        end_time=sp.end_time_unix_nano or None,
                        attributes=_pb_attrs(sp.attributes),
                        status=_Status(_Code(_status_name(sp.status.code)), sp.status.message or None),
                        events=[_Event(e.name, _pb_attrs(e.attributes)) for e in sp.events],
                        resource=resource,
                    )
                )
    return out
