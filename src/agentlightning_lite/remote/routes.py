"""The HTTP routes remote runners use, served on the PolicyServer's port next to ``/v1``.

``POST /agl/v1/claim``, ``POST /agl/v1/heartbeat``, ``POST /agl/v1/rollouts/{id}/complete``,
``POST /agl/v1/rollouts/{id}/reward``, ``POST /agl/v1/spans`` (native span rows or span objects),
``POST /v1/traces`` and ``/rollout/{id}/v1/traces`` (OTLP/HTTP, protobuf or JSON), ``POST`` and
``GET /agl/v1/rollouts``, ``GET /agl/v1/rollouts/{id}``, ``GET /agl/v1/rollouts/{id}/spans``,
``GET /agl/v1/status``. With an API key every route (the OpenAI ones too) answers a missing or
wrong ``Authorization: Bearer`` with 401; bodies over ``max_body_bytes`` get 413; malformed input
gets a 4xx JSON error body (OpenAI style) and the server keeps serving.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route

from .._json import dumps
from ..serving.server import APIError, PolicyServer
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, SPAN_KINDS, TRUSTED, Span
from .otlp import OTLPError, TraceRollouts, decode_json, decode_protobuf, spans_from_otlp
from .queue import RolloutQueue

__all__ = ["DEFAULT_MAX_BODY_BYTES", "ROLLOUT_HEADER", "remote_app"]

logger = logging.getLogger("agentlightning_lite.remote")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
ROLLOUT_HEADER = "x-agl-rollout-id"
MAX_CLAIM_WAIT = 30.0
_KINDS = frozenset(SPAN_KINDS)
_ROW_LEN = 17


def _bad(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> APIError:
    return APIError(status, message, param=param, code=code)


class _BodyLimit:
    """ASGI middleware: refuse request bodies over ``limit`` bytes with a 413 JSON error."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = APIError(
            413, f"request body too large (limit {self.limit} bytes)", code="request_too_large"
        ).response()
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    if int(value) > self.limit:
                        await too_big(scope, receive, send)
                        return
                except ValueError:
                    await _bad("invalid Content-Length header").response()(scope, receive, send)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Any:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise _TooLarge
            return message

        async def tracking_send(message: Any) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await too_big(scope, receive, send)


class _TooLarge(Exception):
    pass


def _auth_checker(api_key: str | None) -> Callable[[Request], None]:
    key = None if api_key is None else api_key.encode()

    def check(request: Request) -> None:
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key):
            raise APIError(
                401,
                "Incorrect API key provided. Pass the server's key as 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )

    return check


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad(f"We could not parse the JSON body of your request: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad("The request body must be a JSON object.", code="invalid_json")
    return body


def _str(body: dict[str, Any], key: str, default: str | None = None, required: bool = False) -> Any:
    value = body.get(key, default)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise _bad(f"'{key}' must be a non-empty string (at most 256 characters)", key)
    return value


def _reward(body: dict[str, Any], key: str = "reward") -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"'{key}' must be a finite number or null, got {value!r}", key)
    return float(value)


def _number_list(value: Any, integer: bool, what: str) -> list[Any] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _bad(f"{what} must be a list of numbers or null")
    for x in value:
        if isinstance(x, bool) or not isinstance(x, int if integer else (int, float)):
            raise _bad(f"{what} must be a list of {'integers' if integer else 'numbers'}")
        if integer and not -(2**31) <= x < 2**31:
            raise _bad(f"{what}: token id out of range: {x}")
    return value if integer else [float(x) for x in value]


def _json_text(value: Any, what: str, obj: bool = False) -> Any:
    if not isinstance(value, str):
        raise _bad(f"{what} must be JSON text")
    try:
        decoded = json.loads(value)
    except ValueError:
        raise _bad(f"{what} must be valid JSON text") from None
    if obj and not isinstance(decoded, dict):
        raise _bad(f"{what} must be a JSON object")
    return decoded


def _opt_str(value: Any, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise _bad(f"{what} must be a string or null")
    return value


def _time(value: Any, what: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise _bad(f"{what} must be a finite number (epoch seconds)")
    return float(value)


def check_row(r: Any, version: int | None) -> tuple[Any, ...]:
    """Validate one wire span row (the store's row layout) and stamp its ``weights_version``."""
    if not isinstance(r, list) or len(r) != _ROW_LEN:
        raise _bad(f"each span row must be a list of {_ROW_LEN} fields", "rows")
    sid, rid = r[0], r[1]
    if not isinstance(sid, str) or not sid or not isinstance(rid, str) or not rid:
        raise _bad("span rows need a span_id and a rollout_id (non-empty strings)", "rows")
    if r[3] not in _KINDS:
        raise _bad(f"span kind must be one of {SPAN_KINDS}, got {r[3]!r}", "rows")
    if r[8] not in ("ok", "error"):
        raise _bad(f"span status must be 'ok' or 'error', got {r[8]!r}", "rows")
    if not isinstance(r[4], str):
        raise _bad("span name must be a string", "rows")
    for i, what in ((2, "parent_id"), (5, "agent"), (9, "error"), (13, "model")):
        _opt_str(r[i], what)
    _time(r[6], "start_time")
    _time(r[7], "end_time", optional=True)
    _json_text(r[10], "input")
    _json_text(r[11], "output")
    attrs_text = r[12]
    attrs = _json_text(attrs_text, "attributes", obj=True)
    _number_list(r[14], True, "prompt_token_ids")
    _number_list(r[15], True, "response_token_ids")
    lps = _number_list(r[16], False, "response_logprobs")
    if version is not None and "weights_version" not in attrs:
        attrs["weights_version"] = version
        attrs_text = dumps(attrs)
    return (*r[:12], attrs_text, r[13], r[14], r[15], lps)


def remote_app(
    server: PolicyServer,
    queue: RolloutQueue,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Any:
    """The server's app with the runner routes added (an ASGI app; see the module docstring)."""
    store = server.store
    inner = server.app  # the OpenAI routes, wrapped below (the caller may then replace server.app)
    check = _auth_checker(server.api_key)
    traces = TraceRollouts()
    known: set[str] = set()

    def version_of(rid: str) -> int:
        v = queue.weights_version_of(rid)
        return int(getattr(server.engine, "version", 0)) if v is None else v

    def require_rollout(rid: str) -> None:
        if rid in known or queue.knows(rid):
            return
        if store.get_rollout(rid) is None:
            raise _bad(f"unknown rollout {rid!r}", "rollout_id", "rollout_not_found", status=404)
        known.add(rid)

    def endpoint(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            check(request)
            try:
                return await fn(request)
            except KeyError as exc:
                raise _bad(f"unknown rollout {exc}", "rollout_id", "rollout_not_found", status=404) from None
            except ValueError as exc:
                raise _bad(str(exc)) from None

        return handler

    @endpoint
    async def claim(request: Request) -> Response:
        body = await _json_body(request)
        worker = _str(body, "worker", required=True)
        wait = body.get("wait", 0.0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_CLAIM_WAIT:
            raise _bad(f"'wait' must be a number of seconds in [0, {MAX_CLAIM_WAIT}]", "wait")
        att = await queue.claim_async(worker, float(wait))
        if att is None:
            return JSONResponse({"rollout": None, "lease_timeout": queue.lease_timeout})
        out = att.public()
        out["llm_path"] = f"/rollout/{att.rollout_id}/v1"
        out["model"] = server.model_name
        out["lease_timeout"] = queue.lease_timeout
        return JSONResponse({"rollout": out, "lease_timeout": queue.lease_timeout})

    @endpoint
    async def heartbeat(request: Request) -> Response:
        body = await _json_body(request)
        worker = _str(body, "worker", required=True)
        rids = body.get("rollout_ids")
        if not isinstance(rids, list) or not all(isinstance(r, str) for r in rids):
            raise _bad("'rollout_ids' must be a list of strings", "rollout_ids")
        lost = queue.heartbeat(worker, rids)
        return JSONResponse({"lost": lost, "lease_timeout": queue.lease_timeout})

    @endpoint
    async def complete(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        body = await _json_body(request)
        status = body.get("status", "succeeded")
        if status not in ROLLOUT_STATUSES or status == "running":
            raise _bad("'status' must be 'succeeded', 'failed' or 'timeout'", "status")
        reward = _reward(body)
        error = _opt_str(body.get("error"), "'error'")
        if queue.knows(rid):
            out = await run_in_threadpool(queue.complete, rid, status, reward, error)
        else:  # a rollout the runner started itself (trace mode): just finish it
            await run_in_threadpool(require_rollout, rid)
            await run_in_threadpool(
                store.finish_rollout, rid, status=status, reward=reward, error=error, only_if_running=True
            )
            out = {"counted": False, "status": status, "reason": "not a queued rollout"}
        return JSONResponse(out)

    @endpoint
    async def reward(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        body = await _json_body(request)
        value = _reward(body)
        if value is None:
            raise _bad("'reward' must be a finite number", "reward")
        await run_in_threadpool(require_rollout, rid)
        await run_in_threadpool(store.set_reward, rid, value)
        return JSONResponse({"ok": True})

    @endpoint
    async def spans_in(request: Request) -> Response:
        body = await _json_body(request)
        rows, objs = body.get("rows"), body.get("spans")
        if rows is None and objs is None:
            raise _bad("send {'rows': [...]} (the store's row layout) or {'spans': [...]}", "rows")
        checked: list[tuple[Any, ...]] = []
        versions: dict[str, int] = {}
        if rows is not None:
            if not isinstance(rows, list):
                raise _bad("'rows' must be a list", "rows")
            for r in rows:
                rid = r[1] if isinstance(r, list) and len(r) == _ROW_LEN and isinstance(r[1], str) else None
                v = None if rid is None else versions.get(rid)
                if rid is not None and v is None:
                    v = versions[rid] = version_of(rid)
                checked.append(check_row(r, v))
        spans: list[Span] = []
        if objs is not None:
            if not isinstance(objs, list):
                raise _bad("'spans' must be a list of span objects", "spans")
            for o in objs:
                try:
                    sp = Span.model_validate(o, context=TRUSTED)
                except ValueError as exc:
                    raise _bad(f"invalid span: {exc}", "spans") from None
                if "weights_version" not in sp.attributes:
                    sp.attributes["weights_version"] = version_of(sp.rollout_id)
                spans.append(sp)
        rids = {r[1] for r in checked} | {s.rollout_id for s in spans}

        def write() -> None:
            for rid in rids:
                require_rollout(rid)
            if checked:
                store._add_rows(checked)
            if spans:
                store.add_spans(spans)

        await run_in_threadpool(write)
        return JSONResponse({"accepted": len(checked) + len(spans)})

    @endpoint
    async def otlp(request: Request) -> Response:
        raw = await request.body()
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        default = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)
        proto = ctype in ("application/x-protobuf", "application/protobuf")
        try:
            if proto:
                decoded = decode_protobuf(raw)
            elif ctype in ("application/json", ""):
                try:
                    body = json.loads(raw) if raw else {}
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise OTLPError(f"invalid JSON: {exc}") from None
                decoded = decode_json(body)
            else:
                raise APIError(
                    415,
                    f"unsupported content type {ctype!r}: use application/x-protobuf or application/json",
                    code="unsupported_media_type",
                )
            spans = spans_from_otlp(decoded, default, traces)
        except OTLPError as exc:
            raise _bad(str(exc), code="invalid_otlp") from None
        for s in spans:
            if "weights_version" not in s.attributes:
                s.attributes["weights_version"] = version_of(s.rollout_id)

        def write() -> None:
            for rid in {s.rollout_id for s in spans}:
                require_rollout(rid)
            store.add_spans(spans)

        await run_in_threadpool(write)
        if proto:  # an empty ExportTraceServiceResponse: zero bytes in protobuf
            return Response(b"", media_type="application/x-protobuf")
        return JSONResponse({})

    @endpoint
    async def start(request: Request) -> Response:
        body = await _json_body(request)
        mode = body.get("mode", "trace")
        if mode not in ROLLOUT_MODES:
            raise _bad(f"'mode' must be one of {ROLLOUT_MODES}", "mode")
        meta = body.get("metadata") or {}
        if not isinstance(meta, dict):
            raise _bad("'metadata' must be an object", "metadata")
        rid = _str(body, "rollout_id")
        try:
            ro = await run_in_threadpool(
                store.start_rollout, body.get("task"), mode=mode, metadata=meta, rollout_id=rid
            )
        except ValueError as exc:
            raise _bad(str(exc), "rollout_id", status=409) from None
        return JSONResponse(ro.model_dump(mode="json"))

    @endpoint
    async def list_rollouts(request: Request) -> Response:
        mode = request.query_params.get("mode")
        status = request.query_params.get("status")
        if mode is not None and mode not in ROLLOUT_MODES:
            raise _bad(f"'mode' must be one of {ROLLOUT_MODES}", "mode")
        if status is not None and status not in ROLLOUT_STATUSES:
            raise _bad(f"'status' must be one of {ROLLOUT_STATUSES}", "status")
        ros = await run_in_threadpool(store.rollouts, mode, status)
        return JSONResponse({"rollouts": [r.model_dump(mode="json") for r in ros]})

    @endpoint
    async def get_rollout(request: Request) -> Response:
        ro = await run_in_threadpool(store.get_rollout, request.path_params["rollout_id"])
        if ro is None:
            raise _bad("unknown rollout", "rollout_id", "rollout_not_found", status=404)
        return JSONResponse(ro.model_dump(mode="json"))

    @endpoint
    async def get_spans(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        await run_in_threadpool(require_rollout, rid)
        sps = await run_in_threadpool(store.spans, rid)
        return JSONResponse({"spans": [s.model_dump(mode="json") for s in sps]})

    @endpoint
    async def status(request: Request) -> Response:
        return JSONResponse({**queue.stats(), "model": server.model_name})

    @endpoint
    async def health(request: Request) -> Response:
        return JSONResponse(
            {"status": "ok", "model": server.model_name, "weights_version": server.engine.version}
        )

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = "not_found" if exc.status_code == 404 else None
        return APIError(
            exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code
        ).response()

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return exc.response()

    async def unexpected(request: Request, exc: Exception) -> Response:
        logger.exception("remote routes: unexpected error")
        return APIError(500, f"internal error: {type(exc).__name__}: {exc}").response()

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # the OpenAI routes and the rest of the PolicyServer: the same key, on every path
        if scope["type"] == "http" and server.api_key is not None:
            try:
                check(Request(scope))
            except APIError as exc:
                await exc.response()(scope, receive, send)
                return
        await inner(scope, receive, send)

    p = "/agl/v1"
    app = Starlette(
        routes=[
            Route(p + "/claim", claim, methods=["POST"]),
            Route(p + "/heartbeat", heartbeat, methods=["POST"]),
            Route(p + "/rollouts", start, methods=["POST"]),
            Route(p + "/rollouts", list_rollouts, methods=["GET"]),
            Route(p + "/rollouts/{rollout_id}", get_rollout, methods=["GET"]),
            Route(p + "/rollouts/{rollout_id}/complete", complete, methods=["POST"]),
            Route(p + "/rollouts/{rollout_id}/reward", reward, methods=["POST"]),
            Route(p + "/rollouts/{rollout_id}/spans", get_spans, methods=["GET"]),
            Route(p + "/spans", spans_in, methods=["POST"]),
            Route(p + "/status", status, methods=["GET"]),
            Route("/v1/traces", otlp, methods=["POST"]),
            Route("/rollout/{rollout_id}/v1/traces", otlp, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Mount("/", app=guarded),
        ],
        exception_handlers={HTTPException: http_error, APIError: api_error, Exception: unexpected},
    )
    return _BodyLimit(app, max_body_bytes)
