"""What every generation route shares once a request is read (:mod:`.request`): the training rollouts'
sampling policy, the token budget, generation through the engine, recording each choice as an ``llm``
span, and the one writer of server-sent events."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

from ...ids import new_span_id
from ...types import Span
from ..chat_format import ChatFormatError, content_text
from ..context import ServingContext
from ..engines.base import GenRequest, GenResult
from ..engines.contract import BackendError
from ..errors import APIError, bad_request
from ..params import Params
from .request import Call

logger = logging.getLogger(__name__)


async def for_training(ctx: ServingContext, call: Call, p: Params) -> None:
    """Apply the server's ``truncated_sampling`` policy to a request of a training rollout (mode
    ``train``) that asks for truncated sampling (``top_p < 1``, ``top_k > 0`` or ``min_p > 0``) or a
    penalty (``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``): ``"ignore"``
    samples from the full tempered distribution instead (``p`` is changed in place and records what
    it asked for in ``params.truncation_ignored``; the first time, a warning is logged), ``"refuse"``
    answers 400. The trainer scores the full vocabulary at the call's temperature, so the logprob
    the engine reports and the one the ratio divides by are of the same distribution only without
    truncation or penalties. Other rollouts (``val``, ``trace``) and unrouted calls keep their settings."""
    policy, asked = ctx.settings.truncated_sampling, p.reshaping()
    if policy == "keep" or not asked or call.rollout_id is None:
        return
    mode = ctx.rollouts.mode(call.rollout_id)
    if mode is None:
        found = await run_in_threadpool(ctx.store.get_rollout, call.rollout_id)
        mode = found.mode if found is not None else "trace"
        ctx.rollouts.set_mode(call.rollout_id, mode)
    if mode != "train":
        return
    names = ", ".join(f"{k}={v}" for k, v in asked.items())
    if policy == "refuse":
        raise bad_request(
            f"Truncated or penalised sampling ({names}) is refused on training rollouts: the trainer "
            "scores the full tempered distribution, so the recorded logprobs would not be the behaviour "
            "policy's. Leave top_p, top_k, min_p and the penalties at their defaults (or serve with "
            "truncated_sampling='ignore').",
            next(iter(asked)),
            code="truncated_sampling_refused",
        )
    p.unshape()
    p.truncation_ignored = asked
    if ctx.rollouts.first_time("truncated_sampling"):
        logger.warning(
            "a training rollout asked for truncated sampling or a penalty (%s): ignored, its calls sample "
            "from the full tempered distribution so that the recorded logprobs are the behaviour policy's "
            "(recorded as params.truncation_ignored; PolicyServer(truncated_sampling='refuse') answers "
            "400 instead)",
            names,
        )


def budget(ctx: ServingContext, prompt_len: int, p: Params, param: str, clamp: bool = False) -> int:
    """The number of new tokens a request may generate; 400 when the prompt leaves no room.

    A ``max_tokens`` past the room the context leaves is a 400 too, unless ``clamp``: then it is cut
    to that room (a harness that always asks for 32000 tokens still gets an answer).
    """
    limit = ctx.engine.max_context
    room = limit - prompt_len
    if room <= 0:
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, your {param} resulted in "
            f"{prompt_len} tokens. Please reduce the length of the {param}.",
            param,
            code="context_length_exceeded",
        )
    if p.max_tokens is not None and p.max_tokens > room:
        if clamp:
            return room
        raise bad_request(
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + p.max_tokens} tokens ({prompt_len} in the {param}, {p.max_tokens} in the "
            f"completion). Please reduce the length of the {param} or completion.",
            param,
            code="context_length_exceeded",
        )
    return p.max_tokens if p.max_tokens is not None else min(ctx.settings.default_max_tokens, room)


def gen_requests(
    prompt_ids: list[int], p: Params, max_tokens: int, request_id: str, **extra: Any
) -> list[GenRequest]:
    """One engine request per choice (``n``); with a seed, choice ``i`` gets ``seed + i``."""
    return [
        GenRequest(
            prompt_token_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            stop=list(p.stop),
            seed=None if p.seed is None else p.seed + i,
            top_logprobs=p.top_logprobs,
            **p.shaping(),
            request_id=f"{request_id}-{i}",
            **extra,
        )
        for i in range(p.n)
    ]


async def generate(
    ctx: ServingContext,
    requests: list[GenRequest],
    rollout_id: str | None = None,
    request: Request | None = None,
) -> list[GenResult]:
    """Submit the requests to the engine and wait for all of them.

    If the client goes away (it disconnects while waiting, when ``request`` is given, or the request
    task is cancelled), the requests are cancelled in the engine: those still queued are dropped and
    those decoding stop at their next step, so they do not hold a slot in the engine's batch. The
    requests of ``rollout_id`` are also cancelled by ``ctx.cancel_rollout`` (a 409 then).
    """
    engine = ctx.engine
    if ctx.rollouts.is_cancelled(rollout_id):
        raise _cancelled(rollout_id)
    futures = [engine.submit(r) for r in requests]
    if not ctx.rollouts.track(rollout_id, futures):  # cancelled meanwhile
        for f in futures:
            engine.cancel(f)
        raise _cancelled(rollout_id)
    waiting = asyncio.ensure_future(asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))
    waiting.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved even if abandoned
    watch = asyncio.ensure_future(_disconnected(request)) if request is not None else None
    try:
        if watch is not None:
            both: set[asyncio.Future[Any]] = {waiting, watch}
            await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():  # the client is gone
                raise APIError(499, "The client closed the request.", code="client_closed_request")
        return list(await waiting)
    except asyncio.CancelledError:
        if not any(f.cancelled() for f in futures):
            raise  # this request's own task is being cancelled: the finally cancels the engine work
        raise _cancelled(rollout_id) from None
    finally:
        ctx.rollouts.untrack(rollout_id, futures)
        if not waiting.done():
            for f in futures:
                engine.cancel(f)
            waiting.cancel()
        if watch is not None:
            watch.cancel()


def _cancelled(rollout_id: str | None) -> APIError:
    return APIError(
        409,
        f"The requests of rollout {rollout_id!r} were cancelled (the rollout timed out or was stopped).",
        code="rollout_cancelled",
    )


async def _disconnected(request: Request) -> None:
    """Return once the client disconnects (the body has been read: only a disconnect is left)."""
    while True:
        message = await request.receive()
        if message.get("type") == "http.disconnect":
            return


def record(ctx: ServingContext, call: Call, task: Any, spans: list[Span], failed: bool) -> None:
    """Write a request's spans; an unrouted call gets an implicit ``trace`` rollout of its own."""
    if not spans:
        return
    rollout_id = call.rollout_id
    implicit = rollout_id is None
    if rollout_id is None:
        if not ctx.settings.record_unrouted:
            return
        ro = ctx.store.start_rollout(
            task, mode="trace", metadata={"implicit": True, "source": "agl.PolicyServer"}
        )
        rollout_id = ro.rollout_id
        spans = [s.model_copy(update={"rollout_id": rollout_id}) for s in spans]
    ctx.store.add_spans(spans)
    if implicit:
        ctx.store.finish_rollout(rollout_id, status="failed" if failed else "succeeded")
    if ctx.settings.flush:
        ctx.store.flush()


def llm_span(
    call: Call, name: str, start: float, input: Any, attributes: dict[str, Any], **fields: Any
) -> Span:
    """The ``llm`` span of one generated choice (or of a failed request)."""
    return Span(
        span_id=new_span_id(),
        rollout_id=call.rollout_id or "",
        parent_id=call.parent_id,
        kind="llm",
        name=name,
        agent=call.agent,
        start_time=start,
        end_time=time.time(),
        input=input,
        model=call.model,
        attributes={"policy": True, "server": "agl", **attributes},
        **fields,
    )


async def engine_failed(
    ctx: ServingContext,
    call: Call,
    name: str,
    start: float,
    input: Any,
    attrs: dict[str, Any],
    prompt_ids: list[int],
    task: Any,
    exc: BaseException,
) -> APIError:
    """Record an ``error`` span for a failed generation and return the error to raise: the status an
    inference server behind the engine answered when it refused the request as malformed (the agent's
    request is at fault, e.g. too long for that server's context), a 502 when that server failed, could
    not be reached or refused the trainer's set-up, else a 500 (the engine itself failed)."""
    status = _backend_status(exc)
    if status is not None:
        logger.warning("PolicyServer: the inference server refused a request: %s", exc)
    else:
        logger.exception("PolicyServer: the engine failed", exc_info=exc)
    span = llm_span(
        call,
        name,
        start,
        input,
        attrs,
        status="error",
        error=f"{type(exc).__name__}: {exc}",
        prompt_token_ids=prompt_ids,
    )
    try:
        await run_in_threadpool(record, ctx, call, task, [span], True)
    except Exception:
        logger.exception("PolicyServer: could not record the error span")
    if status is not None:
        return APIError(status, f"The inference server refused the request: {exc}", code="backend_rejected")
    if isinstance(exc, BackendError):
        return APIError(502, f"The inference server failed: {exc}", type="server_error", code="backend_error")
    return APIError(
        500, f"The engine failed: {type(exc).__name__}: {exc}", type="server_error", code="engine_error"
    )


def _backend_status(exc: BaseException) -> int | None:
    """The status an inference server answered when it refused the generation request itself as
    malformed (400, 413, 422), when ``exc`` is its :class:`BackendError`. A refused adapter load, a
    wrong key (401/403) or an unknown model (404) is the trainer's set-up, not the agent's request."""
    if isinstance(exc, BackendError) and exc.path == "/v1/completions" and exc.status in (400, 413, 422):
        return exc.status
    return None


def usage(prompt_tokens: int, results: Sequence[GenResult]) -> dict[str, int]:
    """OpenAI's ``usage`` object."""
    completion = sum(r.num_tokens for r in results)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def task_of(messages: Any) -> Any:
    """The task recorded on an implicit rollout: the last user message's text."""
    for m in reversed(messages if isinstance(messages, list) else []):
        if isinstance(m, dict) and m.get("role") == "user":
            try:
                return content_text(m.get("content"))
            except ChatFormatError:
                return None
    return None


def pieces(
    ctx: ServingContext, res: GenResult, text: str, decode: Callable[[Sequence[int]], str] | None = None
) -> list[tuple[str, int, int]]:
    """Split ``text`` into streamable deltas aligned with tokens: (delta, first token, end token).
    ``decode``: how token ids read as ``text`` (default: the engine's plain decode)."""
    decode = decode or ctx.engine.decode
    out, emitted, first = [], "", 0
    for k in range(len(res.token_ids)):
        cur = decode(res.token_ids[: k + 1])
        if cur.endswith("\ufffd") or not cur.startswith(emitted):
            continue  # an incomplete UTF-8 character: wait for the next token
        cur = cur[: len(text)]
        if not text.startswith(cur) or len(cur) <= len(emitted):
            continue
        out.append((cur[len(emitted) :], first, k + 1))
        emitted, first = cur, k + 1
    if emitted != text:
        out.append((text[len(emitted) :], first, len(res.token_ids)))
    elif first < len(res.token_ids) and out:
        delta, s, _ = out[-1]
        out[-1] = (delta, s, len(res.token_ids))  # trailing tokens (EOS) ride on the last piece
    return out


def sse(
    events: Sequence[dict[str, Any]], named: bool = False, headers: dict[str, str] | None = None
) -> StreamingResponse:
    """Server-sent events, one per item of ``events``: OpenAI's form (``data: <json>`` lines, then
    ``data: [DONE]``) or, with ``named``, the Responses and Anthropic form (``event: <type>`` before each
    ``data:`` line, no ``[DONE]``). ``headers``: more response headers."""

    async def stream() -> AsyncIterator[bytes]:
        for e in events:
            data = json.dumps(e, ensure_ascii=False)
            line = f"event: {e['type']}\ndata: {data}\n\n" if named else f"data: {data}\n\n"
            yield line.encode("utf-8", "backslashreplace")
        if not named:
            yield b"data: [DONE]\n\n"

    head = {"cache-control": "no-cache", **(headers or {})}
    return StreamingResponse(stream(), media_type="text/event-stream", headers=head)
