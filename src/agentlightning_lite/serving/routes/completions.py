"""``POST /v1/completions``: prompts (text or token ids) in, text with exact tokens out."""

from __future__ import annotations

import secrets
import time
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from ..engines.base import GenRequest, GenResult
from ..errors import APIError, JSONResponse, bad_request
from ..params import Params, parse_params, parse_prompts
from ..structured import ResponseFormatError
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
    usage,
)
from .chat import response_format

if TYPE_CHECKING:
    from ..server import PolicyServer


async def completions(server: PolicyServer, request: Request) -> Response:
    """Complete each prompt ``n`` times and record one ``llm`` span per choice."""
    start = time.time()
    call = await resolve_call(server, request)
    body = call.body
    p = parse_params(body, chat=False, max_n=server.max_n)
    engine = server.engine
    encoded = [
        (text, ids if ids is not None else engine.encode(text or "", add_special_tokens=True))
        for text, ids in parse_prompts(body.get("prompt"))
    ]
    if any(not ids for _, ids in encoded):
        raise bad_request("'prompt' must not be empty", "prompt")
    vocab = engine.vocab_size
    if vocab is not None and any(t >= vocab for _, ids in encoded for t in ids):
        raise bad_request(f"'prompt' holds token ids outside the vocabulary (0 to {vocab - 1})", "prompt")
    budgets = [budget(server, len(ids), p, "prompt") for _, ids in encoded]
    fmt = await response_format(server, body)
    request_id = "cmpl-" + secrets.token_hex(12)
    attrs: dict[str, Any] = {"api": "completions", "request_id": request_id, "engine": type(engine).__name__}
    if fmt is not None:
        attrs["response_format"] = fmt.record()
    reqs: list[GenRequest] = []
    for (text, ids), n_new in zip(encoded, budgets, strict=True):
        reqs += gen_requests(ids, p, n_new, request_id, prompt=text, agent=call.agent, response_format=fmt)
    inputs = [text if text is not None else {"prompt_token_ids": ids} for text, ids in encoded]
    task = inputs[0] if len(inputs) == 1 else inputs
    try:
        results = await generate(server, reqs, call.rollout_id, request)
    except APIError:
        raise
    except ResponseFormatError as exc:
        raise bad_request(str(exc), "response_format") from None
    except Exception as exc:
        raise await engine_failed(
            server, call, "completions", start, task, attrs | {"params": p.record()}, encoded[0][1], task, exc
        ) from exc
    choices, spans = [], []
    total = {
        "prompt_tokens": sum(len(ids) for _, ids in encoded),
        "completion_tokens": sum(r.num_tokens for r in results),
    }
    total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    for i, res in enumerate(results):
        choices.append(
            {
                "index": i,
                "text": res.text,
                "logprobs": _logprobs(server, res) if p.logprobs else None,
                "finish_reason": res.finish_reason,
            }
        )
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
    await run_in_threadpool(record, server, call, task, spans, False)
    created = int(start)
    if p.stream:
        return sse(_chunks(server, request_id, created, choices, results, p, total))
    return JSONResponse(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": server.model_name,
            "choices": choices,
            "usage": total,
        },
        headers={"x-request-id": request_id},
    )


def _logprobs(
    server: PolicyServer, res: GenResult, s: int = 0, e: int | None = None, offset: int = 0
) -> dict:
    e = len(res.token_ids) if e is None else e
    tokens = [server.engine.token_text(t) for t in res.token_ids[s:e]]
    offsets, pos = [], offset
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    tops = None
    if res.top_logprobs:
        tops = [{server.engine.token_text(t): lp for t, lp in res.top_logprobs[k]} for k in range(s, e)]
    return {
        "tokens": tokens,
        "token_logprobs": res.logprobs[s:e],
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def _chunks(
    server: PolicyServer,
    request_id: str,
    created: int,
    choices: list[dict[str, Any]],
    results: list[GenResult],
    p: Params,
    total: dict[str, int],
) -> list[dict[str, Any]]:
    def chunk(choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": server.model_name,
            "choices": choices,
            **extra,
        }

    out = []
    for choice, res in zip(choices, results, strict=True):
        pos = 0
        for delta, s, e in pieces(server, res, choice["text"]):
            lp = _logprobs(server, res, s, e, pos) if p.logprobs else None
            out.append(
                chunk([{"index": choice["index"], "text": delta, "logprobs": lp, "finish_reason": None}])
            )
            pos += len(delta)
        out.append(
            chunk(
                [
                    {
                        "index": choice["index"],
                        "text": "",
                        "logprobs": None,
                        "finish_reason": choice["finish_reason"],
                    }
                ]
            )
        )
    if p.include_usage:
        out.append(chunk([], usage=total))
    return out
