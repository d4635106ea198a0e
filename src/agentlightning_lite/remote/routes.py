"""The HTTP routes remote runners use, served on the PolicyServer's port next to ``/v1``.

``POST /agl/v1/claim``, ``POST /agl/v1/heartbeat``, ``POST /agl/v1/rollouts/{id}/complete``,
``POST /agl/v1/rollouts/{id}/reward``, ``POST /agl/v1/spans`` (native span rows or span objects),
``POST /v1/traces`` and ``/rollout/{id}/v1/traces`` (OTLP/HTTP, protobuf or JSON), ``POST`` and
``GET /agl/v1/rollouts``, ``GET /agl/v1/rollouts/{id}``, ``GET /agl/v1/rollouts/{id}/spans``,
``GET /agl/v1/status``. With an API key every route (as the OpenAI ones) answers a missing or
wrong ``Authorization: Bearer`` with 401; bodies over the server's ``max_body_bytes`` get 413;
malformed input gets a 4xx JSON error body (OpenAI style) and the server keeps serving.

A claim answers with the rollout's lease token (``lease``). Heartbeats, results, rewards and
spans for a claimed rollout must carry it in the ``X-AGL-Lease`` header (several tokens
comma-separated when one request touches several rollouts; OTLP spans may carry theirs as the
span or resource attribute ``agentlightning.lease`` instead): without it they get a 403
(``invalid_lease``) and change nothing. A reward for a rollout whose outcome is counted gets a
409 (``outcome_counted``); spans for a claimed rollout that ended are dropped (``dropped``).
A result may carry the rollout's last span rows (``"rows"``): all are checked first (each a span
of that rollout; otherwise a 400 and nothing written), then the lease, then they are written and
the outcome counted, in one handler (see :meth:`RolloutQueue.complete`). A result may also ask
for the worker's next rollout (``"claim": {"worker": ...}``): once the result is recorded, the
answer's ``next`` is what ``/agl/v1/claim`` would answer without waiting (``null`` when nothing
is queued: the runner then long-polls ``/agl/v1/claim`` as before); a retried result gets the
same rollout again while it runs.

LLM calls to a claimed rollout (``/v1/chat/completions``, ``/v1/completions``, ``/v1/responses``,
``/v1/messages``) need the token as well, or they get the same 403 and record nothing: the claim's
``llm_path`` carries it (``/rollout/<id>/lease/<token>/v1``), since an agent's own OpenAI client
sends only its base URL and API key; ``X-AGL-Lease`` works too. Rollouts the queue did not hand out
(in-process, trace) keep the plain ``/rollout/<id>/v1``.

Errors the caller caused (the package's :class:`~agentlightning_lite.errors.AGLError` family)
get their 4xx here; any other exception is a bug in the server: a 500 with a generic message.
"""

from __future__ import annotations

import json
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .._json import dumps
from ..errors import AGLError, LeaseError, RolloutExistsError, UnknownRolloutError
from ..serving.errors import APIError, JSONResponse, api_error_of, internal_error
from ..serving.routes.request import call_leases, check_auth, parse_json_object, read_body
from ..serving.server import PolicyServer
from ..store.rows import SpanRow
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, SPAN_KINDS, TRUSTED, Span
from .leases import Attempt
from .otlp import TraceRollouts, otlp_response, otlp_spans, read_otlp
from .queue import OutcomeCounted, RolloutQueue

__all__ = ["remote_routes"]

logger = logging.getLogger(__name__)

MAX_CLAIM_WAIT = 30.0
_KINDS = frozenset(SPAN_KINDS)
_ROW_LEN = len(SpanRow._fields)
LEASE_HEADER = "x-agl-lease"
LEASE_ATTR = "agentlightning.lease"
KNOWN_SIZE = 10_000  # rollouts remembered as existing in the store (the oldest are looked up again)


def request_leases(request: Request) -> list[str]:
    """The lease tokens a request carries (``X-AGL-Lease``, comma-separated; and ``/lease/<token>``
    in the URL of the rollout-routed endpoints)."""
    return call_leases(request)


def http_error(exc: AGLError) -> APIError:
    """The answer to an error a runner caused (a lease error names the header that fixes it)."""
    if isinstance(exc, LeaseError):
        return _bad(
            f"{exc}: send the lease token of its claim in the X-AGL-Lease header",
            "X-AGL-Lease",
            "invalid_lease",
            status=403,
        )
    if isinstance(exc, OutcomeCounted):
        return api_error_of(exc, "reward", "outcome_counted")
    return api_error_of(exc)


def _bad(message: str, param: str | None = None, code: str | None = None, status: int = 400) -> APIError:
    return APIError(status, message, param=param, code=code)


async def _json_body(request: Request, limit: int) -> dict[str, Any]:
    return parse_json_object(await read_body(request, limit), empty={})


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


def check_row(r: Any, version: int | None) -> SpanRow:
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
    return SpanRow._make((*r[:12], attrs_text, r[13], r[14], r[15], lps))


def _result_rows(raw: Any, rid: str, version_of: Callable[[str], int]) -> list[SpanRow] | None:
    """The span rows sent with a result (``None``: none sent), each checked and of rollout ``rid``."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise _bad("'rows' must be a list of span rows", "rows")
    version = version_of(rid) if raw else None
    out = []
    for r in raw:
        row = check_row(r, version)
        if row[1] != rid:
            raise _bad(f"the rows sent with a result must be spans of its rollout {rid!r}", "rows")
        out.append(row)
    return out


def remote_routes(server: PolicyServer, queue: RolloutQueue) -> list[BaseRoute]:
    """The runner routes for ``server`` (mounted through its ``extra_routes`` hook)."""
    store = server.store
    limit = server.settings.max_body_bytes

    def check(request: Request) -> None:
        check_auth(server, request)

    def guard(rid: str, leases: list[str]) -> None:
        try:
            queue.check_call(rid, leases)
        except LeaseError as exc:
            raise http_error(exc) from None

    server.rollout_guard = guard  # LLM calls to a claimed rollout need its lease token
    traces = TraceRollouts()
    known: OrderedDict[str, None] = OrderedDict()  # rollouts seen in the store (an LRU)

    def version_of(rid: str) -> int:
        v = queue.weights_version_of(rid)
        return server.engine.version if v is None else v

    def require_rollout(rid: str) -> None:
        if rid in known or queue.knows(rid):
            return
        if store.get_rollout(rid) is None:
            raise _bad(f"unknown rollout {rid!r}", "rollout_id", "rollout_not_found", status=404)
        known[rid] = None
        while len(known) > KNOWN_SIZE:
            known.popitem(last=False)

    def endpoint(fn: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def handler(request: Request) -> Response:
            check(request)
            try:
                return await fn(request)
            except AGLError as exc:  # the caller's doing: its 4xx
                raise http_error(exc) from None
            except APIError:
                raise
            except Exception as exc:  # anything else is a bug: a generic 500, the traceback logged
                raise internal_error(f"{request.method} {request.url.path}", exc) from None

        return handler

    @endpoint
    async def claim(request: Request) -> Response:
        body = await _json_body(request, limit)
        worker = _str(body, "worker", required=True)
        wait = body.get("wait", 0.0)
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_CLAIM_WAIT:
            raise _bad(f"'wait' must be a number of seconds in [0, {MAX_CLAIM_WAIT}]", "wait")
        att = await queue.claim_async(worker, float(wait))
        return JSONResponse({"rollout": claimed(att), "lease_timeout": queue.lease_timeout})

    def claimed(att: Attempt | None) -> dict[str, Any] | None:
        """A claim's answer for the runner (``None``: nothing queued)."""
        if att is None:
            return None
        out = att.public()
        # the agent's OpenAI client sends only base_url and api_key: the lease rides in the URL
        out["llm_path"] = f"/rollout/{quote(att.rollout_id, safe='')}/lease/{att.lease}/v1"
        out["model"] = server.model_name
        # a key for this rollout's model calls only (a harness gets it)
        if server.settings.api_key is not None:
            out["rollout_key"] = server.rollout_key(att.rollout_id)
        out["lease_timeout"] = queue.lease_timeout
        return out

    @endpoint
    async def heartbeat(request: Request) -> Response:
        body = await _json_body(request, limit)
        worker = _str(body, "worker", required=True)
        rids = body.get("rollout_ids")
        if not isinstance(rids, list) or not all(isinstance(r, str) for r in rids):
            raise _bad("'rollout_ids' must be a list of strings", "rollout_ids")
        lost = queue.heartbeat(worker, rids, request_leases(request))
        return JSONResponse({"lost": lost, "lease_timeout": queue.lease_timeout})

    @endpoint
    async def complete(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        body = await _json_body(request, limit)
        status = body.get("status", "succeeded")
        if status not in ROLLOUT_STATUSES or status == "running":
            raise _bad("'status' must be 'succeeded', 'failed' or 'timeout'", "status")
        reward = _reward(body)
        error = _opt_str(body.get("error"), "'error'")
        rows = _result_rows(body.get("rows"), rid, version_of)  # all checked before anything is written
        ask = body.get("claim")
        if ask is not None and not isinstance(ask, dict):
            raise _bad("'claim' must be an object: {'worker': ...}", "claim")
        worker = None if ask is None else _str(ask, "worker", required=True)
        leases = request_leases(request)

        def finish() -> dict[str, Any]:
            out = result()
            if worker is not None:  # the next rollout for the worker, never waited for
                out["next"] = claimed(queue.claim(worker, after=rid))
            return out

        def result() -> dict[str, Any]:
            if queue.knows(rid):
                return queue.complete(rid, status, reward, error, leases, rows=rows)
            # a rollout the runner started itself (trace mode): its spans, then finish it
            require_rollout(rid)
            if rows:
                store.add_span_rows(rows)
            store.finish_rollout(rid, status=status, reward=reward, error=error, only_if_running=True)
            out: dict[str, Any] = {"counted": False, "status": status, "reason": "not a queued rollout"}
            if rows is not None:
                out["accepted"] = len(rows)
            return out

        return JSONResponse(await run_in_threadpool(finish))

    @endpoint
    async def reward(request: Request) -> Response:
        rid = request.path_params["rollout_id"]
        body = await _json_body(request, limit)
        value = _reward(body)
        if value is None:
            raise _bad("'reward' must be a finite number", "reward")
        leases = request_leases(request)

        def write() -> None:
            if queue.knows(rid):
                queue.set_reward(rid, value, leases)
                return
            ro = store.get_rollout(rid)  # a rollout the runner started itself (trace mode)
            if ro is None:
                raise UnknownRolloutError(rid)
            if ro.status != "running":
                raise OutcomeCounted(f"rollout {rid!r} is {ro.status}: its reward cannot change")
            store.set_reward(rid, value)

        await run_in_threadpool(write)
        return JSONResponse({"ok": True})

    @endpoint
    async def spans_in(request: Request) -> Response:
        body = await _json_body(request, limit)
        rows, objs = body.get("rows"), body.get("spans")
        if rows is None and objs is None:
            raise _bad("send {'rows': [...]} (the store's row layout) or {'spans': [...]}", "rows")
        checked: list[SpanRow] = []
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
        leases = request_leases(request)

        def write() -> dict[str, int]:
            ended = queue.check_writes(rids, leases)
            for rid in rids - ended:
                require_rollout(rid)
            rows = [r for r in checked if r[1] not in ended]
            objs = [s for s in spans if s.rollout_id not in ended]
            if rows:
                store.add_span_rows(rows)
            if objs:
                store.add_spans(objs)
            dropped = len(checked) + len(spans) - len(rows) - len(objs)
            return {"accepted": len(rows) + len(objs), **({"dropped": dropped} if dropped else {})}

        return JSONResponse(await run_in_threadpool(write))

    @endpoint
    async def otlp(request: Request) -> Response:
        decoded, default, proto = await read_otlp(request, limit)  # shared with agl-lite serve
        leases = request_leases(request)
        for d in decoded:  # a span's own lease token: checked here, never stored
            for attrs in (d.attributes, d.resource):
                token = attrs.get(LEASE_ATTR)
                if isinstance(token, str) and token:
                    leases.append(token)
            d.attributes.pop(LEASE_ATTR, None)
        spans = otlp_spans(decoded, default, traces)
        for s in spans:
            if "weights_version" not in s.attributes:
                s.attributes["weights_version"] = version_of(s.rollout_id)

        def write() -> None:
            rids = {s.rollout_id for s in spans}
            ended = queue.check_writes(rids, leases)
            for rid in rids - ended:
                require_rollout(rid)
            store.add_spans([s for s in spans if s.rollout_id not in ended])

        await run_in_threadpool(write)
        return otlp_response(proto)

    @endpoint
    async def start(request: Request) -> Response:
        body = await _json_body(request, limit)
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
        except RolloutExistsError as exc:
            raise api_error_of(exc, "rollout_id") from None
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

    p = "/agl/v1"
    return [
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
        Route("/rollout/{rollout_id}/lease/{lease}/v1/traces", otlp, methods=["POST"]),
    ]
