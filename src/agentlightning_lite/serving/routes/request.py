"""Reading a request: auth, the rollout and agent it is routed to, its lease, its JSON body."""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from ..context import ServingContext
from ..errors import APIError, bad_request

AGENT_HEADER = "x-agl-agent"
ROLLOUT_HEADER = "x-agl-rollout-id"
PARENT_HEADER = "x-agl-parent-span-id"
LEASE_HEADER = "x-agl-lease"


@dataclass
class Call:
    """What a request resolved to before generation."""

    body: dict[str, Any]
    rollout_id: str | None
    agent: str | None
    parent_id: str | None
    model: str


def _presented_keys(request: Request) -> list[str]:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        token = ""
    return [t.strip() for t in (token, request.headers.get("x-api-key", "")) if t.strip()]


def check_auth(ctx: ServingContext, request: Request, rollout_id: str | None = None) -> None:
    """Raise a 401 unless the request carries the server's API key (when it has one), as
    ``Authorization: Bearer <key>`` (OpenAI) or ``x-api-key: <key>`` (Anthropic).

    With ``rollout_id`` (a model call routed to that rollout), that rollout's own key
    (``ctx.rollout_key(rollout_id)``) is accepted too: a key handed to one rollout's agent
    reaches that rollout's model routes and nothing else.
    """
    if ctx.settings.api_key is None:
        return
    expected = [ctx.settings.api_key.encode()]
    if rollout_id is not None:
        expected.append(ctx.rollout_key(rollout_id).encode())
    presented = _presented_keys(request)
    if not any(hmac.compare_digest(t.encode(), e) for t in presented for e in expected):
        raise APIError(
            401,
            "Incorrect API key provided. Pass the server's key as 'Authorization: Bearer <key>' "
            "(or 'x-api-key: <key>').",
            type="invalid_request_error",
            code="invalid_api_key",
        )


def routed_to(request: Request) -> str | None:
    """The rollout id a request names (URL, else header), unchecked."""
    return request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)


async def rollout_of(ctx: ServingContext, request: Request) -> str | None:
    """The rollout a request is routed to (URL, else header), checked against the store; 404 if unknown."""
    rid = routed_to(request)
    if rid is None:
        return None
    if not ctx.rollouts.known(rid):
        found = await run_in_threadpool(ctx.store.get_rollout, rid)
        if found is None:
            raise APIError(
                404,
                f"Unknown rollout id {rid!r}: start the rollout in the store before routing calls to it.",
                param="rollout_id",
                code="rollout_not_found",
            )
        ctx.rollouts.remember(rid)
    return rid


def call_leases(request: Request) -> list[str]:
    """The lease tokens a call carries: from its URL (``/rollout/<id>/lease/<token>/v1``) and from
    the ``X-AGL-Lease`` header (comma-separated)."""
    tokens = [t.strip() for t in request.headers.get(LEASE_HEADER, "").split(",") if t.strip()]
    in_url = request.path_params.get("lease")
    return [in_url, *tokens] if in_url else tokens


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 as soon as it passes ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(
        413, f"The request body is {size} bytes; this server takes at most {limit}.", code="body_too_large"
    )


def parse_json_object(raw: bytes, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON object from a request body; 400 for anything else (``empty`` stands for no body).

    >>> parse_json_object(b'{"n": 1}')
    {'n': 1}
    >>> parse_json_object(b'[1]').status
    Traceback (most recent call last):
    ...
    agentlightning_lite.serving.errors.APIError: The request body must be a JSON object.
    """
    if not raw and empty is not None:
        return empty
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from None
    except RecursionError:
        raise bad_request(
            "The JSON body of your request is nested too deeply.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    try:  # JSON's \u escapes can spell lone surrogates, which no tokenizer or store can take
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode()
        raise bad_request(
            f"The request body holds text that is not valid Unicode (a lone surrogate {bad}).",
            code="invalid_unicode",
        ) from None
    return body


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object body: 413 past ``limit`` bytes, 400 for anything that is not an object."""
    return parse_json_object(await read_body(request, limit))


async def resolve_call(ctx: ServingContext, request: Request) -> Call:
    """Authenticate and parse a generation request: body, rollout, agent, parent span, model."""
    check_auth(ctx, request, routed_to(request))
    body = await read_json(request, ctx.settings.max_body_bytes)
    rollout_id = await rollout_of(ctx, request)
    if rollout_id is not None and ctx.rollout_guard is not None:  # a claimed rollout: its lease
        ctx.rollout_guard(rollout_id, call_leases(request))
    agent = request.path_params.get("agent") or request.headers.get(AGENT_HEADER)
    model = body.get("model")
    if model is None:
        model = ctx.model_name
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    base = model
    if model not in ctx.served_names and "@" in model:
        base, _, suffix = model.rpartition("@")
        agent = agent or suffix or None
    if base not in ctx.served_names and model not in ctx.lora_adapters:
        raise APIError(
            404,
            f"The model `{_printable(model)}` does not exist. This server serves: "
            f"{', '.join(sorted(ctx.served_names))}.",
            param="model",
            code="model_not_found",
        )
    parent = request.headers.get(PARENT_HEADER)
    return Call(body=body, rollout_id=rollout_id, agent=agent, parent_id=parent, model=ctx.model_name)


def _printable(text: str, limit: int = 200) -> str:
    """``text`` safe to echo in a JSON error: lone surrogates escaped, cut at ``limit`` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."
