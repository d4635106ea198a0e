"""``POST /v1/completions``: prompts (text or token ids) in, text with exact tokens out."""

from __future__ import annotations

import secrets
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..context import ServingContext
from ..engines.base import GenRequest, GenResult
from ..errors import APIError, JSONResponse, bad_request
from ..params import Params, parse_params, parse_prompts
from ..structured import ResponseFormatError
from .calls import (
    budget,
    engine_failed,
    for_training,
    gen_requests,
    generate,
    llm_span,
    pieces,
    record,
    sse,
    usage,
)
from .chat import response_format
from .request import resolve_call


async def completions(ctx: ServingContext, request: Request) -> Response:
    """Complete each prompt ``n`` times and record one ``llm`` span per choice."""
    start = time.time()
    call = await resolve_call(ctx, request)
    body = call.body
    p = parse_params(body, chat=False, max_n=ctx.settings.max_n)
    await for_training(ctx, call, p)
    engine = ctx.engine
    encoded = [
        (text, ids if ids is not None else engine.encode(text or "", add_special_tokens=True))
        for text, ids in parse_prompts(body.get("prompt"))
    ]
    if any(not ids for _, ids in encoded):
        raise bad_request("'prompt' must not be empty", "prompt")
    vocab = engine.vocab_size
    if vocab is not None and any(t >= vocab for _, ids in encoded for t in ids):
        raise bad_request(f"'prompt' holds token ids outside the vocabulary (0 to {vocab - 1})", "prompt")
    clamp = ctx.clamps("completions")
    budgets = [budget(ctx, len(ids), p, "prompt", clamp=clamp) for _, ids in encoded]
    fmt = await response_format(ctx, body)
    adapter = ctx.lora_adapter_of(body)
    # vLLM's extensions: the prompt's and the reply's token ids in each choice; tokens named by id
    want_ids = body.get("return_token_ids") is True
    as_ids = body.get("return_tokens_as_token_ids") is True
    request_id = "cmpl-" + secrets.token_hex(12)
    attrs: dict[str, Any] = {"api": "completions", "request_id": request_id, "engine": type(engine).__name__}
    if fmt is not None:
        attrs["response_format"] = fmt.record()
    reqs: list[GenRequest] = []
    for (text, ids), n_new in zip(encoded, budgets, strict=True):
        reqs += gen_requests(
            ids,
            p,
            n_new,
            request_id,
            prompt=text,
            agent=call.agent,
            response_format=fmt,
            session=call.rollout_id,
            adapter=adapter,
        )
    inputs = [text if text is not None else {"prompt_token_ids": ids} for text, ids in encoded]
    task = inputs[0] if len(inputs) == 1 else inputs
    try:
        results = await generate(ctx, reqs, call.rollout_id, request)
    except APIError:
        raise
    except ResponseFormatError as exc:
        raise bad_request(str(exc), "response_format") from None
    except Exception as exc:
        raise await engine_failed(
            ctx, call, "completions", start, task, attrs | {"params": p.record()}, encoded[0][1], task, exc
        ) from exc
    choices, spans = [], []
    total = {
        "prompt_tokens": sum(len(ids) for _, ids in encoded),
        "completion_tokens": sum(r.num_tokens for r in results),
    }
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    for i, res in enumerate(results):
        choice: dict[str, Any] = {
            "index": i,
            "text": res.text,
            "logprobs": _logprobs(ctx, res, as_ids=as_ids) if p.logprobs else None,
            "finish_reason": res.finish_reason,
            "stop_reason": res.stop_reason if isinstance(res.stop_reason, str) else None,
        }
        if want_ids:
            choice["prompt_token_ids"] = list(res.prompt_token_ids)
            choice["token_ids"] = list(res.token_ids)
        choices.append(choice)
        spans.append(
            llm_span(
                call,
                "completions",
                start,
                inputs[i // p.n],
                attrs
                | {
                    "params": p.record() | {"max_tokens": budgets[i // p.n]},
                    "choice_index": i,
                    "n": p.n,
                    "finish_reason": res.finish_reason,
                    "stop_reason": res.stop_reason,
                    "usage": usage(len(res.prompt_token_ids), [res]),
                    "request_usage": total,
                    "weights_version": res.weights_version,
                    "adapter": res.adapter,
                },
                output=res.text,
                prompt_token_ids=res.prompt_token_ids,
                response_token_ids=res.token_ids,
                response_logprobs=res.logprobs,
            )
        )
    await run_in_threadpool(record, ctx, call, task, spans, False)
    created = int(start)
    if p.stream:
        return sse(_chunks(ctx, request_id, created, choices, results, p, total, want_ids, as_ids))
    return JSONResponse(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": ctx.model_name,
            "choices": choices,
            "usage": total,
        },
        headers={"x-request-id": request_id},
    )


def _logprobs(
    ctx: ServingContext,
    res: GenResult,
    s: int = 0,
    e: int | None = None,
    offset: int = 0,
    as_ids: bool = False,
) -> dict:
    e = len(res.token_ids) if e is None else e
    text = (lambda t: f"token_id:{t}") if as_ids else ctx.engine.token_text
    tokens = [text(t) for t in res.token_ids[s:e]]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = None
    if res.top_logprobs:
        tops = [{text(t): lp for t, lp in res.top_logprobs[k]} for k in range(s, e)]
    return {
        "tokens": tokens,
        "token_logprobs": res.logprobs[s:e],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _chunks(
    ctx: ServingContext,
    request_id: str,
    created: int,
    choices: list[dict[str, Any]],
    results: list[GenResult],
    p: Params,
    total: dict[str, int],
    want_ids: bool = False,
    as_ids: bool = False,
) -> list[dict[str, Any]]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": ctx.model_name,
            "choices": choices,
            **extra,
        }

    out = []
    for choice, res in zip(choices, results, strict=True):
        pos = sent = 0
        for k, (delta, s, e) in enumerate(pieces(ctx, res, choice["text"])):
            lp = _logprobs(ctx, res, s, e, pos, as_ids) if p.logprobs else None
            piece: dict[str, Any] = {
                "index": choice["index"],
                "text": delta,
                "logprobs": lp,
                "finish_reason": None,
            }
            if want_ids:  # as vLLM streams them: the prompt's ids first, then each chunk's own ids
                if k == 0:
                    piece["prompt_token_ids"] = list(res.prompt_token_ids)
                piece["token_ids"] = list(res.token_ids[s:e])
            out.append(chunk([piece]))
            pos += len(delta)
            sent = e
        last: dict[str, Any] = {
            "index": choice["index"],
            "text": "",
            "logprobs": None,
            "finish_reason": choice["finish_reason"],
        }
        if want_ids:  # tokens no text piece carried (a reply that is only EOS)
            if not sent:
                last["prompt_token_ids"] = list(res.prompt_token_ids)
            last["token_ids"] = list(res.token_ids[sent:])
        out.append(chunk([last]))
    if p.include_usage:
        out.append(chunk([], usage=total))
    return out
