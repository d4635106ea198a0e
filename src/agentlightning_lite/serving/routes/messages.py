"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (the Anthropic Messages API): converted to a
chat request and served by the chat route's :func:`~.chat.serve_chat`, so every call is one ``llm`` span
with exact tokens; errors in Anthropic's ``{"type": "error", "error": {...}}`` shape."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...errors import AGLError
from ..anthropic_messages import convert_request, error_body, message_object, stream_events
from ..chat_format import ChatFormatError
from ..chat_request import ChatRequest, render_prompt
from ..context import ServingContext
from ..errors import APIError, JSONResponse, api_error_of, bad_request, internal_error
from .calls import sse
from .chat import serve_chat
from .chat_stream import content_deltas
from .request import resolve_call

Handler = Callable[[ServingContext, Request], Awaitable[Response]]


def anthropic_errors(fn: Handler) -> Handler:
    """Answer every error of ``fn`` in Anthropic's shape (same status as the OpenAI routes)."""

    @functools.wraps(fn)
    async def handle(ctx: ServingContext, request: Request) -> Response:
        try:
            return await fn(ctx, request)
        except APIError as exc:
            err = exc
        except AGLError as exc:
            err = api_error_of(exc)
        except Exception as exc:  # a bug: logged, answered with a generic 500
            err = internal_error(f"{request.method} {request.url.path}", exc)
        return JSONResponse(error_body(err.status, err.message), status_code=err.status)

    return handle


def _convert(body: dict[str, Any]) -> ChatRequest:
    try:
        return convert_request(body)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None


@anthropic_errors
async def messages(ctx: ServingContext, request: Request) -> Response:
    """Answer one Messages request (``stream`` or not) and record its ``llm`` span."""
    call = await resolve_call(ctx, request)
    body = call.body
    req = _convert(body)
    run = await serve_chat(ctx, call, req, request)
    choice, result = run.choices[0], run.results[0]
    message = message_object(
        req.request_id,
        str(body.get("model") or ctx.model_name),
        choice["message"],
        choice["finish_reason"],
        result.stop_reason,
        run.total["prompt_tokens"],
        run.total["completion_tokens"],
    )
    if not req.params.stream:
        return JSONResponse(message, headers={"request-id": req.request_id})
    deltas = content_deltas(ctx, run)
    return sse(stream_events(message, deltas), named=True, headers={"request-id": req.request_id})


@anthropic_errors
async def count_tokens(ctx: ServingContext, request: Request) -> Response:
    """``{"input_tokens": N}``: the prompt the same request would be served with, in tokens (nothing
    is generated or recorded)."""
    call = await resolve_call(ctx, request)
    req = _convert(call.body)
    try:
        text, _, _ = render_prompt(ctx.engine, req)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    return JSONResponse({"input_tokens": len(ctx.engine.encode(text))})
