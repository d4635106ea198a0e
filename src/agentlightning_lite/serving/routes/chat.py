"""``POST /v1/chat/completions``: chat messages (with tools) in, assistant messages with exact tokens out."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..chat import ChatFormatError, parse_tool_calls, select_tools
from ..engines.base import GenResult
from ..errors import APIError, JSONResponse, bad_request
from ..params import Params, parse_params
from ..structured import ResponseFormat, ResponseFormatError, parse_response_format
from .calls import (
    budget,
    engine_failed,
    gen_requests,
    generate,
    llm_span,
    pieces,
    record,
    resolve_call,
    sse,
    task_of,
    usage,
)

if TYPE_CHECKING:
    from ..server import PolicyServer


async def chat_completions(server: PolicyServer, request: Request) -> Response:
    """Generate ``n`` assistant replies to ``messages`` and record one ``llm`` span per reply."""
    start = time.time()
    call = await resolve_call(server, request)
    body = call.body
    p = parse_params(body, chat=True, max_n=server.max_n)
    messages = body.get("messages")
    if messages is None:
        raise bad_request(
            "Missing required parameter: 'messages'.", "messages", code="missing_required_parameter"
        )
    engine = server.engine
    tools, tool_choice = body.get("tools"), body.get("tool_choice")
    try:
        offered, _ = select_tools(tools, tool_choice)
        prompt_text = engine.apply_chat_template(messages, tools, tool_choice)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    fmt = await response_format(server, body, offered or None)
    prompt_ids = engine.encode(prompt_text)
    max_tokens = budget(server, len(prompt_ids), p, "messages")
    request_id = "chatcmpl-" + secrets.token_hex(12)
    attrs: dict[str, Any] = {
        "api": "chat.completions",
        "request_id": request_id,
        "params": p.record() | {"max_tokens": max_tokens, "tool_choice": tool_choice},
        "tools": offered or None,
        "prompt_text": prompt_text,
        "engine": type(engine).__name__,
    }
    if fmt is not None:
        attrs["response_format"] = fmt.record()
    task = task_of(messages)
    reqs = gen_requests(
        prompt_ids,
        p,
        max_tokens,
        request_id,
        messages=messages,
        tools=offered or None,
        prompt=prompt_text,
        agent=call.agent,
        session=call.rollout_id,
        adapter=server.lora_adapter_of(call.body),
        response_format=fmt,
    )
    try:
        results = await generate(server, reqs, call.rollout_id, request)
    except APIError:
        raise
    except ResponseFormatError as exc:  # the engine could not honour it (a script that does not fit)
        raise bad_request(str(exc), "response_format") from None
    except Exception as exc:
        raise await engine_failed(
            server, call, "chat.completions", start, messages, attrs, prompt_ids, task, exc
        ) from exc

    choices, spans = [], []
    total = usage(len(prompt_ids), results)
    for i, res in enumerate(results):
        content: str | None = res.text
        calls: list[dict[str, Any]] = []
        if offered:
            content, calls = parse_tool_calls(res.text, offered)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else res.finish_reason
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": {"content": _logprobs(server, res), "refusal": None} if p.logprobs else None,
                "finish_reason": finish,
            }
        )
        spans.append(
            llm_span(
                call,
                "chat.completions",
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
                },
                output=message,
                prompt_token_ids=res.prompt_token_ids,
                response_token_ids=res.token_ids,
                response_logprobs=res.logprobs,
            )
        )
    await run_in_threadpool(record, server, call, task, spans, False)
    created = int(start)
    fingerprint = f"agl-{type(engine).__name__}-v{results[0].weights_version}"
    if p.stream:
        return sse(_chunks(server, request_id, created, fingerprint, choices, results, p, total))
    return JSONResponse(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": created,
            "model": server.model_name,
            "system_fingerprint": fingerprint,
            "choices": choices,
            "usage": total,
        },
        headers={"x-request-id": request_id},
    )


async def response_format(
    server: PolicyServer, body: dict[str, Any], tools: list[dict[str, Any]] | None = None
) -> ResponseFormat | None:
    """The request's ``response_format``, checked by the engine; a 400 naming it otherwise."""
    try:
        fmt = parse_response_format(body.get("response_format"))
        if fmt is not None:  # compiling a schema (and, once, the tokenizer's masks) takes a moment
            await run_in_threadpool(server.engine.check_response_format, fmt, tools)
    except ResponseFormatError as exc:
        raise bad_request(str(exc), "response_format") from None
    return fmt


def _logprobs(
    server: PolicyServer, res: GenResult, start: int = 0, end: int | None = None
) -> list[dict[str, Any]]:
    out = []
    end = len(res.token_ids) if end is None else end
    for k in range(start, end):
        text = server.engine.token_text(res.token_ids[k])
        entry: dict[str, Any] = {
            "token": text,
            "logprob": res.logprobs[k],
            "bytes": list(text.encode("utf-8")),
            "top_logprobs": [],
        }
        if res.top_logprobs:
            for tid, lp in res.top_logprobs[k]:
                t = server.engine.token_text(tid)
                entry["top_logprobs"].append({"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))})
        out.append(entry)
    return out


def _chunks(
    server: PolicyServer,
    request_id: str,
    created: int,
    fingerprint: str,
    choices: list[dict[str, Any]],
    results: list[GenResult],
    p: Params,
    total: dict[str, int],
) -> list[dict[str, Any]]:
    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict:
        return {
            "id": request_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": server.model_name,
            "system_fingerprint": fingerprint,
            "choices": [{"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        }

    def lp(res: GenResult, s: int, e: int) -> Any:
        return {"content": _logprobs(server, res, s, e), "refusal": None} if p.logprobs else None

    out: list[dict[str, Any]] = []
    for choice, res in zip(choices, results, strict=True):
        i, msg = choice["index"], choice["message"]
        out.append(chunk(i, {"role": "assistant", "content": ""}))
        if msg.get("tool_calls"):
            if msg.get("content"):
                out.append(chunk(i, {"content": msg["content"]}))
            for j, tc in enumerate(msg["tool_calls"]):
                every = lp(res, 0, len(res.token_ids)) if j == 0 else None
                out.append(chunk(i, {"tool_calls": [{"index": j, **tc}]}, logprobs=every))
        else:
            for delta, s, e in pieces(server, res, msg["content"] or ""):
                out.append(chunk(i, {"content": delta}, logprobs=lp(res, s, e)))
        out.append(chunk(i, {}, finish=choice["finish_reason"]))
    if p.include_usage:  # OpenAI: "usage": null on every chunk, then one chunk with usage only
        for c in out:
            c["usage"] = None
        last = chunk(0, {})
        last["choices"], last["usage"] = [], total
        out.append(last)
    return out
