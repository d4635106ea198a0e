"""``POST /v1/responses`` (the OpenAI Responses API): converted to chat messages and served through
the chat route's engine path, so every call is one ``llm`` span with exact tokens."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from ..chat_format import ChatFormatError
from ..errors import JSONResponse, bad_request
from ..openai_responses import convert_request, new_id, output_items, response_object, stream_events, usage_of
from ..params import parse_params
from .calls import pieces, resolve_call
from .chat import run_converted

if TYPE_CHECKING:
    from ..server import PolicyServer

#: body fields of the Responses API this server reads (the rest, e.g. ``reasoning``, ``include``,
#: ``prompt_cache_key``, ``metadata``, are accepted and have no effect on generation)
_UNSUPPORTED = ("background", "conversation", "prompt")


def _sampling_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-parameter view of a Responses body (``max_output_tokens`` is ``max_tokens``)."""
    out: dict[str, Any] = {
        k: body[k] for k in ("temperature", "top_p", "top_logprobs", "stream") if k in body
    }
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs"):
        out["logprobs"] = True
    return out


async def responses(server: PolicyServer, request: Request) -> Response:
    """Answer one Responses request (``stream`` or not) and record its ``llm`` span."""
    call = await resolve_call(server, request)
    body = call.body
    for key in _UNSUPPORTED:
        if body.get(key) is not None:
            raise bad_request(f"'{key}' is not supported by this server", key, code="unsupported_parameter")
    if body.get("n") not in (None, 1):
        raise bad_request("'n' is not supported by the Responses API", "n")
    p = parse_params(_sampling_body(body), chat=True, max_n=1)
    history = None
    previous = body.get("previous_response_id")
    if previous is not None:
        history = server.responses.get(previous) if isinstance(previous, str) else None
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
    response_id = new_id("resp")
    run = await run_converted(
        server, request, call, req, p, api="responses", request_id=response_id,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False, response_format=req.response_format,
    )  # fmt: skip
    choice, result = run.choices[0], run.results[0]
    output = output_items(choice["message"], req.custom_tools)
    response = response_object(
        response_id,
        body,
        str(body.get("model") or server.model_name),
        run.created,
        output,
        usage_of(run.total),
        choice["finish_reason"],
        body.get("max_output_tokens"),
    )
    if body.get("store") is not False:
        instructions = 1 if body.get("instructions") else 0
        server.responses[response_id] = [*req.messages[instructions:], choice["message"]]
    if not p.stream:
        return JSONResponse(response, headers={"x-request-id": response_id})
    text = choice["message"].get("content") or ""
    deltas = [d for d, _, _ in pieces(server, result, text)] if text else None
    return _sse(stream_events(response, deltas))


def _sse(events: list[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events in the Responses form: an ``event:`` line naming each one's type."""

    async def body() -> AsyncIterator[bytes]:
        for e in events:
            data = json.dumps(e, ensure_ascii=False)
            yield f"event: {e['type']}\ndata: {data}\n\n".encode("utf-8", "backslashreplace")

    return StreamingResponse(body(), media_type="text/event-stream", headers={"cache-control": "no-cache"})
