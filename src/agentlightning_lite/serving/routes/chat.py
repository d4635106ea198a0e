"""``POST /v1/chat/completions``: chat messages (with tools) in, assistant messages with exact tokens out."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..chat_format import ChatFormatError, content_text, parse_tool_calls, select_tools
from ..engines.base import GenResult
from ..errors import APIError, JSONResponse, bad_request
from ..params import Params, parse_params
from ..structured import ResponseFormat, ResponseFormatError, parse_response_format
from .calls import (
    Call,
    budget,
    engine_failed,
    for_training,
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


async def chat_completions(server: PolicyServer, request: Request) -> Response:
    """Generate ``n`` assistant replies to ``messages`` and record one ``llm`` span per reply."""
    call = await resolve_call(server, request)
    body = call.body
    p = parse_params(body, chat=True, max_n=server.max_n)
    messages = body.get("messages")
    if messages is None:
        raise bad_request(
            "Missing required parameter: 'messages'.", "messages", code="missing_required_parameter"
        )
    run = await run_chat(
        server,
        request,
        call,
        messages,
        body.get("tools"),
        body.get("tool_choice"),
        p,
        api="chat.completions",
        request_id="chatcmpl-" + secrets.token_hex(12),
        response_format=body.get("response_format"),
        clamp=server.clamps("chat.completions"),
    )
    if p.stream:
        return sse(_chunks(server, run, p))
    return JSONResponse(
        {
            "id": run.request_id,
            "object": "chat.completion",
            "created": run.created,
            "model": server.model_name,
            "system_fingerprint": run.fingerprint,
            "choices": run.choices,
            "usage": run.total,
        },
        headers={"x-request-id": run.request_id},
    )


async def run_converted(
    server: PolicyServer,
    request: Request,
    call: Call,
    req: Any,
    p: Params,
    *,
    api: str,
    request_id: str,
    parallel_tool_calls: bool,
    response_format: Any = None,
) -> ChatRun:
    """:func:`run_chat` for a request another dialect was converted into (``req``: its ``messages``,
    ``tools``, ``tool_choice`` and ``dropped_tools``): ``max_tokens`` clamped as the server says for
    ``api``, late system messages merged, the dropped tools recorded on the span."""
    return await run_chat(
        server,
        request,
        call,
        req.messages,
        req.tools or None,
        req.tool_choice,
        p,
        api=api,
        request_id=request_id,
        response_format=response_format,
        clamp=server.clamps(api),
        parallel_tool_calls=parallel_tool_calls,
        merge_system=True,
        extra={"dropped_tools": req.dropped_tools} if req.dropped_tools else {},
    )


async def run_chat(
    server: PolicyServer,
    request: Request,
    call: Call,
    messages: Any,
    tools: Any,
    tool_choice: Any,
    p: Params,
    *,
    api: str,
    request_id: str,
    response_format: Any = None,
    clamp: bool = False,
    parallel_tool_calls: bool = True,
    merge_system: bool = False,
    extra: dict[str, Any] | None = None,
) -> ChatRun:
    """Serve chat ``messages`` (OpenAI shape) through the engine and record one ``llm`` span per
    choice: the one capture point of every API dialect (``api`` names the dialect on the span).

    ``clamp``: a ``max_tokens`` larger than the context leaves is cut to the room left (recorded as
    ``params.max_tokens_requested``) instead of a 400. ``parallel_tool_calls=False`` keeps only the
    first tool call of a reply. ``merge_system``: when the chat template refuses a system message
    after the first turn, such messages are merged into the leading system prompt (recorded as
    ``system_merged``). ``extra``: more span attributes.
    """
    start = time.time()
    engine = server.engine
    merged = False
    await for_training(server, call, p)
    try:
        offered, _ = select_tools(tools, tool_choice)
        try:
            prompt_text = engine.apply_chat_template(messages, tools, tool_choice)
        except ChatFormatError:
            if not merge_system or not has_late_system(messages):
                raise
            messages, merged = merge_system_messages(messages), True
            prompt_text = engine.apply_chat_template(messages, tools, tool_choice)
    except ChatFormatError as exc:
        raise bad_request(str(exc), exc.param) from None
    fmt = await response_format_of(server, response_format, offered or None)
    prompt_ids = engine.encode(prompt_text)
    max_tokens = budget(server, len(prompt_ids), p, "messages", clamp=clamp)
    params = p.record() | {"max_tokens": max_tokens, "tool_choice": tool_choice}
    if p.max_tokens is not None and max_tokens < p.max_tokens:
        params["max_tokens_requested"] = p.max_tokens
    attrs: dict[str, Any] = {
        "api": api,
        "request_id": request_id,
        "params": params,
        "tools": offered or None,
        "prompt_text": prompt_text,
        "engine": type(engine).__name__,
        **(extra or {}),
    }
    if merged:
        attrs["system_merged"] = True
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
        raise await engine_failed(server, call, api, start, messages, attrs, prompt_ids, task, exc) from exc

    choices, spans = [], []
    total = usage(len(prompt_ids), results)
    for i, res in enumerate(results):
        content: str | None = res.text
        calls: list[dict[str, Any]] = []
        if offered:
            content, calls = parse_tool_calls(res.text, offered)
            if not parallel_tool_calls:
                calls = calls[:1]
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
                api,
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
    return ChatRun(
        request_id=request_id,
        created=int(start),
        fingerprint=f"agl-{type(engine).__name__}-v{results[0].weights_version}",
        choices=choices,
        results=results,
        total=total,
        prompt_ids=prompt_ids,
        max_tokens=max_tokens,
    )


def has_late_system(messages: Any) -> bool:
    """Whether a ``system``/``developer`` message follows a message of another role."""
    if not isinstance(messages, list):
        return False
    seen_other = False
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("system", "developer"):
            if seen_other:
                return True
        else:
            seen_other = True
    return False


def merge_system_messages(messages: list[Any]) -> list[Any]:
    """The messages with every ``system``/``developer`` message merged into one leading system
    message (their texts in order, a blank line apart): for chat templates that take a system
    prompt only first.

    >>> merge_system_messages([{"role": "system", "content": "A"}, {"role": "user", "content": "q"},
    ...                        {"role": "system", "content": "B"}])
    [{'role': 'system', 'content': 'A\\n\\nB'}, {'role': 'user', 'content': 'q'}]
    """
    system = [m for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
    texts = [content_text(m.get("content"), "messages") for m in system]
    return [{"role": "system", "content": "\n\n".join(t for t in texts if t)}, *rest]


async def response_format(
    server: PolicyServer, body: dict[str, Any], tools: list[dict[str, Any]] | None = None
) -> ResponseFormat | None:
    """The request's ``response_format``, checked by the engine; a 400 naming it otherwise."""
    return await response_format_of(server, body.get("response_format"), tools)


async def response_format_of(
    server: PolicyServer, value: Any, tools: list[dict[str, Any]] | None = None
) -> ResponseFormat | None:
    """A ``response_format`` value, checked by the engine; a 400 naming it otherwise."""
    try:
        fmt = parse_response_format(value)
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


def _chunks(server: PolicyServer, run: ChatRun, p: Params) -> list[dict[str, Any]]:
    request_id, created, fingerprint = run.request_id, run.created, run.fingerprint
    choices, results, total = run.choices, run.results, run.total

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
