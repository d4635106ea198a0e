"""What every generation route shares: auth, resolving a request to a rollout and agent, the token
budget, generation through the engine, and recording each choice as an ``llm`` span."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import StreamingResponse

from ...tracer import new_span_id
from ...types import Span
from ..chat_format import ChatFormatError, content_text
from ..engines.base import GenRequest, GenResult
from ..engines.http import BackendError
from ..errors import APIError, bad_request
from ..params import Params

if TYPE_CHECKING:
    from ..server import PolicyServer

logger = logging.getLogger(__name__)

AGENT_HEADER = "x-agl-agent"
ROLLOUT_HEADER = "x-agl-rollout-id"
PARENT_HEADER = "x-agl-parent-span-id"
LEASE_HEADER = "x-agl-lease"


@dataclass
class Call:
    """What a request resolved to before generation."""

    body: dict[str, Any]
    rollout_id: str | None
    agent: str | None
    parent_id: str | None
    model: str


def _presented_keys(request: Request) -> list[str]:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        token = ""
    return [t.strip() for t in (token, request.headers.get("x-api-key", "")) if t.strip()]


def check_auth(server: PolicyServer, request: Request, rollout_id: str | None = None) -> None:
    """Raise a 401 unless the request carries the server's API key (when it has one), as
    ``Authorization: Bearer <key>`` (OpenAI) or ``x-api-key: <key>`` (Anthropic).

    With ``rollout_id`` (a model call routed to that rollout), that rollout's own key
    (``server.rollout_key(rollout_id)``) is accepted too: a key handed to one rollout's agent
    reaches that rollout's model routes and nothing else.
    """
    if server.api_key is None:
        return
    expected = [server.api_key.encode()]
    if rollout_id is not None:
        expected.append(server.rollout_key(rollout_id).encode())
    presented = _presented_keys(request)
    if not any(hmac.compare_digest(t.encode(), e) for t in presented for e in expected):
        raise APIError(
            401,
            "Incorrect API key provided. Pass the server's key as 'Authorization: Bearer <key>' "
            "(or 'x-api-key: <key>').",
            type="invalid_request_error",
            code="invalid_api_key",
        )


def _routed_to(request: Request) -> str | None:
    """The rollout id a request names (URL, else header), unchecked."""
    return request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)


async def rollout_of(server: PolicyServer, request: Request) -> str | None:
    """The rollout a request is routed to (URL, else header), checked against the store; 404 if unknown."""
    rid = request.path_params.get("rollout_id") or request.headers.get(ROLLOUT_HEADER)
    if rid is None:
        return None
    if rid not in server._known_rollouts:
        found = await run_in_threadpool(server.store.get_rollout, rid)
        if found is None:
            raise APIError(
                404,
                f"Unknown rollout id {rid!r}: start the rollout in the store before routing calls to it.",
                param="rollout_id",
                code="rollout_not_found",
            )
        server._known_rollouts.add(rid)
    return rid


async def for_training(server: PolicyServer, call: Call, p: Params) -> None:
    """Apply the server's ``truncated_sampling`` policy to a request of a training rollout (mode
    ``train``) that asks for truncated sampling (``top_p < 1``, ``top_k > 0`` or ``min_p > 0``) or a
    penalty (``presence_penalty``, ``frequency_penalty``, ``repetition_penalty``): ``"ignore"``
    samples from the full tempered distribution instead (``p`` is changed in place and records what
    it asked for in ``params.truncation_ignored``; the first time, a warning is logged), ``"refuse"``
    answers 400. The trainer scores the full vocabulary at the call's temperature, so the logprob
    the engine reports and the one the ratio divides by are of the same distribution only without
    truncation or penalties. Other rollouts (``val``, ``trace``) and unrouted calls keep their settings."""
    policy, asked = server.truncated_sampling, p.reshaping()
    if policy == "keep" or not asked or call.rollout_id is None:
        return
    mode = server._rollout_modes.get(call.rollout_id)
    if mode is None:
        found = await run_in_threadpool(server.store.get_rollout, call.rollout_id)
        mode = found.mode if found is not None else "trace"
        server._rollout_modes[call.rollout_id] = mode
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
    if not server._warned_truncation:
        server._warned_truncation = True
        logger.warning(
            "a training rollout asked for truncated sampling or a penalty (%s): ignored, its calls sample "
            "from the full tempered distribution so that the recorded logprobs are the behaviour policy's "
            "(recorded as params.truncation_ignored; PolicyServer(truncated_sampling='refuse') answers "
            "400 instead)",
            names,
        )


def call_leases(request: Request) -> list[str]:
    """The lease tokens a call carries: from its URL (``/rollout/<id>/lease/<token>/v1``) and from
    the ``X-AGL-Lease`` header (comma-separated)."""
    tokens = [t.strip() for t in request.headers.get(LEASE_HEADER, "").split(",") if t.strip()]
    in_url = request.path_params.get("lease")
    return [in_url, *tokens] if in_url else tokens


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with a 413 as soon as it passes ``limit`` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(size, limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(size: int, limit: int) -> APIError:
    return APIError(
        413, f"The request body is {size} bytes; this server takes at most {limit}.", code="body_too_large"
    )


def parse_json_object(raw: bytes, empty: dict[str, Any] | None = None) -> dict[str, Any]:
    """A JSON object from a request body; 400 for anything else (``empty`` stands for no body).

    >>> parse_json_object(b'{"n": 1}')
    {'n': 1}
    >>> parse_json_object(b'[1]').status
    Traceback (most recent call last):
    ...
    agentlightning_lite.serving.errors.APIError: The request body must be a JSON object.
    """
    if not raw and empty is not None:
        return empty
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"We could not parse the JSON body of your request: {exc}", code="invalid_json"
        ) from None
    except RecursionError:
        raise bad_request(
            "The JSON body of your request is nested too deeply.", code="invalid_json"
        ) from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    try:  # JSON's \u escapes can spell lone surrogates, which no tokenizer or store can take
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end].encode("utf-8", "backslashreplace").decode()
        raise bad_request(
            f"The request body holds text that is not valid Unicode (a lone surrogate {bad}).",
            code="invalid_unicode",
        ) from None
    return body


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object body: 413 past ``limit`` bytes, 400 for anything that is not an object."""
    return parse_json_object(await read_body(request, limit))


async def resolve_call(server: PolicyServer, request: Request) -> Call:
    """Authenticate and parse a generation request: body, rollout, agent, parent span, model."""
    check_auth(server, request, _routed_to(request))
    body = await read_json(request, server.max_body_bytes)
    rollout_id = await rollout_of(server, request)
    if rollout_id is not None and server.rollout_guard is not None:  # a claimed rollout: its lease
        server.rollout_guard(rollout_id, call_leases(request))
    agent = request.path_params.get("agent") or request.headers.get(AGENT_HEADER)
    model = body.get("model")
    if model is None:
        model = server.model_name
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model")
    base = model
    if model not in server.served_names and "@" in model:
        base, _, suffix = model.rpartition("@")
        agent = agent or suffix or None
    if base not in server.served_names and model not in server.lora_adapters:
        raise APIError(
            404,
            f"The model `{_printable(model)}` does not exist. This server serves: "
            f"{', '.join(sorted(server.served_names))}.",
            param="model",
            code="model_not_found",
        )
    parent = request.headers.get(PARENT_HEADER)
    return Call(body=body, rollout_id=rollout_id, agent=agent, parent_id=parent, model=server.model_name)


def _printable(text: str, limit: int = 200) -> str:
    """``text`` safe to echo in a JSON error: lone surrogates escaped, cut at ``limit`` characters."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit] + "..."


def budget(server: PolicyServer, prompt_len: int, p: Params, param: str, clamp: bool = False) -> int:
    """The number of new tokens a request may generate; 400 when the prompt leaves no room.

    A ``max_tokens`` past the room the context leaves is a 400 too, unless ``clamp``: then it is cut
    to that room (a harness that always asks for 32000 tokens still gets an answer).
    """
    limit = server.engine.max_context
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
    return p.max_tokens if p.max_tokens is not None else min(server.default_max_tokens, room)


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
    server: PolicyServer,
    requests: list[GenRequest],
    rollout_id: str | None = None,
    request: Request | None = None,
) -> list[GenResult]:
    """Submit the requests to the engine and wait for all of them.

    If the client goes away (it disconnects while waiting, when ``request`` is given, or the request
    task is cancelled), the requests are cancelled in the engine: those still queued are dropped and
    those decoding stop at their next step, so they do not hold a slot in the engine's batch. The
    requests of ``rollout_id`` are also cancelled by ``server.cancel_rollout`` (a 409 then).
    """
    engine = server.engine
    if rollout_id is not None and rollout_id in server._cancelled:
        raise _cancelled(rollout_id)
    futures = [engine.submit(r) for r in requests]
    if not server._track(rollout_id, futures, add=True):  # cancelled meanwhile
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
        server._track(rollout_id, futures, add=False)
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


def record(server: PolicyServer, call: Call, task: Any, spans: list[Span], failed: bool) -> None:
    """Write a request's spans; an unrouted call gets an implicit ``trace`` rollout of its own."""
    if not spans:
        return
    rollout_id = call.rollout_id
    implicit = rollout_id is None
    if rollout_id is None:
        if not server.record_unrouted:
            return
        ro = server.store.start_rollout(
            task, mode="trace", metadata={"implicit": True, "source": "agl.PolicyServer"}
        )
        rollout_id = ro.rollout_id
        spans = [s.model_copy(update={"rollout_id": rollout_id}) for s in spans]
    server.store.add_spans(spans)
    if implicit:
        server.store.finish_rollout(rollout_id, status="failed" if failed else "succeeded")
    if server.flush:
        server.store.flush()


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
    server: PolicyServer,
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
        await run_in_threadpool(record, server, call, task, [span], True)
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


def pieces(server: PolicyServer, res: GenResult, text: str) -> list[tuple[str, int, int]]:
    """Split ``text`` into streamable deltas aligned with tokens: (delta, first token, end token)."""
    out, emitted, first = [], "", 0
    for k in range(len(res.token_ids)):
        cur = server.engine.decode(res.token_ids[: k + 1])
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


def sse(chunks: list[dict[str, Any]]) -> StreamingResponse:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""

    async def events() -> AsyncIterator[bytes]:
        for c in chunks:
            yield f"data: {json.dumps(c, ensure_ascii=False)}\n\n".encode("utf-8", "backslashreplace")
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers={"cache-control": "no-cache"})
