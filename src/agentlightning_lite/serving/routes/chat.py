"""``POST /v1/chat/completions``: chat messages (with tools) in, assistant messages with exact tokens out;
and :func:`serve_chat`, which serves the chat request of every dialect."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..chat_format import ChatFormatError, select_tools
from ..chat_request import ChatRequest, chat_request, render_prompt
from ..context import ServingContext
from ..engines.base import GenResult
from ..errors import APIError, JSONResponse, bad_request
from ..structured import ResponseFormat, ResponseFormatError, parse_response_format
from .calls import (
    budget,
    engine_failed,
    for_training,
    gen_requests,
    generate,
    llm_span,
    record,
    sse,
    task_of,
    usage,
)
from .chat_stream import Streamed, chat_chunks, reply_decoder, stream_reply, token_logprobs
from .request import Call, resolve_call

logger = logging.getLogger(__name__)


@dataclass
class ChatRun:
    """One chat request served and recorded: what each dialect's route renders its answer from."""

    request_id: str
    created: int
    fingerprint: str
    choices: list[dict[str, Any]]
    results: list[GenResult]
    total: dict[str, int]
    prompt_ids: list[int]
    max_tokens: int
    #: per choice, when the request streams: what each piece of its reply made certain (``None``: the
    #: reply was read whole and is replayed)
    streamed: list[Streamed | None] = field(default_factory=list)


async def chat_completions(ctx: ServingContext, request: Request) -> Response:
    """Generate ``n`` assistant replies to ``messages`` and record one ``llm`` span per reply."""
    call = await resolve_call(ctx, request)
    req = chat_request(call.body, ctx.settings.max_n)
    run = await serve_chat(ctx, call, req, request)
    if req.params.stream:
        return sse(chat_chunks(ctx, run, req.params))
    return JSONResponse(
        {
            "id": run.request_id,
            "object": "chat.completion",
            "created": run.created,
            "model": ctx.model_name,
            "system_fingerprint": run.fingerprint,
            "choices": run.choices,
            "usage": run.total,
        },
        headers={"x-request-id": run.request_id},
    )


async def serve_chat(
    ctx: ServingContext, call: Call, req: ChatRequest, http: Request | None = None
) -> ChatRun:
    """Serve a chat request through the engine and record one ``llm`` span per choice: the one capture
    point of every API dialect (``req.api`` names the dialect on the span).

    ``http``: the HTTP request being answered (its client going away cancels the generation). A
    ``max_tokens`` larger than the context leaves is cut to the room left when ``ctx.clamps(req.api)``
    (recorded as ``params.max_tokens_requested``) instead of a 400. Each reply is read by
    ``ctx.reply_parser`` (the served model family's way of writing tool calls and reasoning).
    """
    start = time.time()
    engine, p = ctx.engine, req.params
    await for_training(ctx, call, p)
    try:
        offered, _ = select_tools(req.tools, req.tool_choice)
        prompt_text, messages, merged = render_prompt(engine, req)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    fmt = await response_format_of(ctx, req.response_format, offered or None)
    prompt_ids = engine.encode(prompt_text)
    max_tokens = budget(ctx, len(prompt_ids), p, "messages", clamp=ctx.clamps(req.api))
    params = p.record() | {"max_tokens": max_tokens, "tool_choice": req.tool_choice}
    if p.max_tokens is not None and max_tokens < p.max_tokens:
        params["max_tokens_requested"] = p.max_tokens
    if req.chat_template_kwargs:
        params["chat_template_kwargs"] = req.chat_template_kwargs
    attrs: dict[str, Any] = {
        "api": req.api,
        "request_id": req.request_id,
        "params": params,
        "tools": offered or None,
        "prompt_text": prompt_text,
        "engine": type(engine).__name__,
        "tool_parser": ctx.reply_parser.name,
        "reasoning_parser": ctx.reply_parser.reasoning_parser,
    }
    if req.dropped_tools:
        attrs["dropped_tools"] = req.dropped_tools
    if merged:
        attrs["system_merged"] = True
    if fmt is not None:
        attrs["response_format"] = fmt.record()
    task = task_of(messages)
    reqs = gen_requests(
        prompt_ids,
        p,
        max_tokens,
        req.request_id,
        messages=messages,
        tools=offered or None,
        prompt=prompt_text,
        agent=call.agent,
        session=call.rollout_id,
        adapter=ctx.lora_adapter_of(call.body),
        response_format=fmt,
    )
    try:
        results = await generate(ctx, reqs, call.rollout_id, http)
    except APIError:
        raise
    except ResponseFormatError as exc:  # the engine could not honour it (a script that does not fit)
        raise bad_request(str(exc), "response_format") from None
    except Exception as exc:
        raise await engine_failed(ctx, call, req.api, start, messages, attrs, prompt_ids, task, exc) from exc

    choices, spans, streamed = [], [], []
    total = usage(len(prompt_ids), results)
    for i, res in enumerate(results):
        text = reply_text(ctx, res)
        # read piece by piece off the event loop: each piece reads the reply so far
        by_piece = await run_in_threadpool(stream_reply, ctx, res, text, offered) if p.stream else None
        reply = by_piece[0] if by_piece is not None else ctx.reply_parser.parse(text, offered or None)
        streamed.append(by_piece[1] if by_piece is not None else None)
        calls = reply.tool_calls if req.parallel_tool_calls else reply.tool_calls[:1]
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else res.finish_reason
        extra: dict[str, Any] = {}
        if reply.tool_parse_failed:  # the whole reply too: a format may drop what it cannot read
            extra = {"tool_parse_failed": True, "reply_text": text}
            warn_unparsed(ctx, text)
        if finish != res.finish_reason:  # tool calls read from a reply cut at max_tokens: say so too
            extra["engine_finish_reason"] = res.finish_reason
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": token_logprobs(ctx, res), "refusal": None} if p.logprobs else None,
                "finish_reason": finish,
            }
        )
        spans.append(
            llm_span(
                call,
                req.api,
                start,
                messages,
                attrs
                | {
                    "choice_index": i,
                    "n": p.n,
                    "finish_reason": finish,
                    "stop_reason": res.stop_reason,
                    "usage": usage(len(prompt_ids), [res]),
                    "request_usage": total,
                    "weights_version": res.weights_version,
                    "adapter": res.adapter,
                }
                | extra,
                output=message,
                prompt_token_ids=res.prompt_token_ids,
                response_token_ids=res.token_ids,
                response_logprobs=res.logprobs,
            )
        )
    await run_in_threadpool(record, ctx, call, task, spans, False)
    return ChatRun(
        request_id=req.request_id,
        created=int(start),
        fingerprint=f"agl-{type(engine).__name__}-v{results[0].weights_version}",
        choices=choices,
        results=results,
        total=total,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
        streamed=streamed,
    )


def warn_unparsed(ctx: ServingContext, text: str) -> None:
    """Warn, the first time only, that a reply held a tool-call marker but no call could be read."""
    if not ctx.rollouts.first_time("tool_parse_failed"):
        return
    excerpt = text if len(text) <= 200 else text[:200] + "..."
    logger.warning(
        "a reply holds a tool-call marker of the %r tool parser but no call could be read from it: it is "
        "served as content and recorded with tool_parse_failed=true on its llm span (counted as "
        "tools/unparsed in the training step's metrics; warned once). Check that the tool parser fits the "
        "model (PolicyServer(tool_parser=...), docs/models.md). The reply: %r",
        ctx.reply_parser.name,
        excerpt,
    )


def reply_text(ctx: ServingContext, res: GenResult) -> str:
    """The reply as the reply parser reads it: ``res.text``, or the tokens decoded with their special
    tokens for a parser whose markers are special tokens, or, where the served tokenizer marks a text
    parser's markers (``<tool_call>``, ``<think>``) special, decoded with those markers and no other
    special token (``ctx.reply_markers``). The token ids stay the whole reply's."""
    if ctx.reply_parser.special_tokens or ctx.reply_markers:
        return reply_decoder(ctx)(res.token_ids)
    return res.text


async def response_format(
    ctx: ServingContext, body: dict[str, Any], tools: list[dict[str, Any]] | None = None
) -> ResponseFormat | None:
    """The request's ``response_format``, checked by the engine; a 400 naming it otherwise."""
    return await response_format_of(ctx, body.get("response_format"), tools)


async def response_format_of(
    ctx: ServingContext, value: Any, tools: list[dict[str, Any]] | None = None
) -> ResponseFormat | None:
    """A ``response_format`` value, checked by the engine; a 400 naming it otherwise."""
    try:
        fmt = parse_response_format(value)
        if fmt is not None:  # compiling a schema (and, once, the tokenizer's masks) takes a moment
            await run_in_threadpool(ctx.engine.check_response_format, fmt, tools)
    except ResponseFormatError as exc:
        raise bad_request(str(exc), "response_format") from None
    return fmt
