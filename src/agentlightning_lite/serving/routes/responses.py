"""``POST /v1/responses`` (the OpenAI Responses API): converted to a chat request and served by the
chat route's :func:`~.chat.serve_chat`, so every call is one ``llm`` span with exact tokens."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..chat_format import ChatFormatError
from ..context import ServingContext
from ..errors import JSONResponse, bad_request
from ..openai_responses import convert_request, output_items, response_object, stream_events, usage_of
from .calls import sse
from .chat import serve_chat
from .chat_stream import content_deltas
from .request import resolve_call

#: body fields of the Responses API this server refuses (the rest it does not read, e.g. ``reasoning``,
#: ``include``, ``prompt_cache_key``, ``metadata``, are accepted and have no effect on generation)
_UNSUPPORTED = ("background", "conversation", "prompt")


async def responses(ctx: ServingContext, request: Request) -> Response:
    """Answer one Responses request (``stream`` or not) and record its ``llm`` span."""
    call = await resolve_call(ctx, request)
    body = call.body
    for key in _UNSUPPORTED:
        if body.get(key) is not None:
            raise bad_request(f"'{key}' is not supported by this server", key, code="unsupported_parameter")
    history = None
    previous = body.get("previous_response_id")
    if previous is not None:
        history = ctx.responses.get(previous) if isinstance(previous, str) else None
        if history is None:
            raise bad_request(
                f"Previous response with id {previous!r} not found: this server keeps the last 1,000 "
                "stored responses of its life; send the whole conversation in 'input' instead.",
                "previous_response_id",
                code="previous_response_not_found",
            )
    try:
        req = convert_request(body, history)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    run = await serve_chat(ctx, call, req, request)
    choice = run.choices[0]
    output = output_items(choice["message"], req.custom_tools)
    response = response_object(
        req.request_id,
        body,
        str(body.get("model") or ctx.model_name),
        run.created,
        output,
        usage_of(run.total),
        choice["finish_reason"],
        body.get("max_output_tokens"),
    )
    if body.get("store") is not False:
        instructions = 1 if body.get("instructions") else 0
        ctx.responses[req.request_id] = [*req.messages[instructions:], choice["message"]]
    if not req.params.stream:
        return JSONResponse(response, headers={"x-request-id": req.request_id})
    deltas = content_deltas(ctx, run)
    return sse(stream_events(response, deltas), named=True)
