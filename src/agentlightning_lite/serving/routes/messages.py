"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (the Anthropic Messages API): converted to
chat messages and served through the chat route's engine path, so every call is one ``llm`` span with
exact tokens; errors in Anthropic's ``{"type": "error", "error": {...}}`` shape."""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ...errors import AGLError
from ..anthropic_messages import (
    convert_request,
    error_body,
    message_object,
    new_id,
    sampling_body,
    stream_events,
)
from ..chat_format import ChatFormatError
from ..errors import APIError, JSONResponse, api_error_of, bad_request, internal_error
from ..params import parse_params
from .calls import pieces, resolve_call
from .chat import has_late_system, merge_system_messages, run_converted

if TYPE_CHECKING:
    from ..server import PolicyServer

Handler = Callable[["PolicyServer", Request], Awaitable[Response]]


def anthropic_errors(fn: Handler) -> Handler:
    """Answer every error of ``fn`` in Anthropic's shape (same status as the OpenAI routes)."""

    @functools.wraps(fn)
    async def handle(server: PolicyServer, request: Request) -> Response:
        try:
            return await fn(server, request)
        except APIError as exc:
            err = exc
        except AGLError as exc:
            err = api_error_of(exc)
        except Exception as exc:  # a bug: logged, answered with a generic 500
            err = internal_error(f"{request.method} {request.url.path}", exc)
        return JSONResponse(error_body(err.status, err.message), status_code=err.status)

    return handle


def _convert(body: dict[str, Any]) -> Any:
    try:
        return convert_request(body)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None


def _check_temperature(body: dict[str, Any]) -> None:
    t = body.get("temperature")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and not 0.0 <= t <= 1.0:
        raise bad_request(f"temperature: must be between 0 and 1, got {t!r}", "temperature")


@anthropic_errors
async def messages(server: PolicyServer, request: Request) -> Response:
    """Answer one Messages request (``stream`` or not) and record its ``llm`` span."""
    call = await resolve_call(server, request)
    body = call.body
    _check_temperature(body)
    p = parse_params(sampling_body(body), chat=True, max_n=1)
    req = _convert(body)
    message_id = new_id("msg")
    run = await run_converted(
        server, request, call, req, p, api="messages", request_id=message_id,
        parallel_tool_calls=req.parallel_tool_calls,
    )  # fmt: skip
    choice, result = run.choices[0], run.results[0]
    message = message_object(
        message_id,
        str(body.get("model") or server.model_name),
        choice["message"],
        choice["finish_reason"],
        result.stop_reason,
        run.total["prompt_tokens"],
        run.total["completion_tokens"],
    )
    if not p.stream:
        return JSONResponse(message, headers={"request-id": message_id})
    text = choice["message"].get("content") or ""
    deltas = [d for d, _, _ in pieces(server, result, text)] if text else None
    return _sse(stream_events(message, deltas), message_id)


@anthropic_errors
async def count_tokens(server: PolicyServer, request: Request) -> Response:
    """``{"input_tokens": N}``: the prompt the same request would be served with, in tokens (nothing
    is generated or recorded)."""
    call = await resolve_call(server, request)
    req = _convert(call.body)
    engine = server.engine
    msgs = req.messages
    try:
        try:
            text = engine.apply_chat_template(msgs, req.tools or None, req.tool_choice)
        except ChatFormatError:
            if not has_late_system(msgs):
                raise
            text = engine.apply_chat_template(merge_system_messages(msgs), req.tools or None, req.tool_choice)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    return JSONResponse({"input_tokens": len(engine.encode(text))})


def _sse(events: list[dict[str, Any]], message_id: str) -> StreamingResponse:
    """Server-sent events in Anthropic's form: ``event: <type>`` then ``data: <json>``."""

    async def body() -> AsyncIterator[bytes]:
        for e in events:
            data = json.dumps(e, ensure_ascii=False)
            yield f"event: {e['type']}\ndata: {data}\n\n".encode("utf-8", "backslashreplace")

    headers = {"cache-control": "no-cache", "request-id": message_id}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)
