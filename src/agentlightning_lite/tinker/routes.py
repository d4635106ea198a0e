"""The routes of the Tinker API (all under ``/api/v1``): sessions, the asynchronous operations that
answer a request id at once, and ``/retrieve_future``, which long-polls their outcome.

Training operations run on one worker thread, each model's in ``seq_id`` order (:mod:`.futures`);
samples run concurrently on the engine. An operation that fails resolves to
``{"error": ..., "category": "user" | "server"}``, which the SDK raises as ``RequestFailedError``;
a request the server cannot even take (unknown ids, a malformed body) gets a 4xx with that body.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..serving.errors import APIError
from ..serving.routes.request import read_body as read_limited
from ..store.memory import MemoryStore
from .backend import TrainingBackend, adam_params
from .futures import FutureTable, OpError, OrderedQueue, Outcome
from .recording import Recorder
from .registry import Registry
from .wire import decode_forward_backward_request, encode_forward_backward_output, encode_sample_response

__all__ = ["MAX_BODY_BYTES", "MAX_SAMPLES", "PROTO", "TinkerAPI", "read_body", "read_json", "unzstd"]

logger = logging.getLogger(__name__)

PROTO = "application/x-protobuf"
MAX_SAMPLES = 1024  #: the most ``num_samples`` one ``asample`` request may ask for
#: the largest request body (a ``forward_backward`` batch, after zstd): 256 sequences of 32k tokens
#: with three float32 arrays each fit
MAX_BODY_BYTES = 256 * 2**20
#: Tinker's ``LoraConfig`` flags: which modules a training model's LoRA adapts (each true by default)
LORA_FLAGS = ("train_attn", "train_mlp", "train_unembed")


def error(message: str, status: int, category: str = "user") -> JSONResponse:
    return JSONResponse({"error": message, "category": category}, status_code=status)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused (413) as soon as it passes ``limit`` bytes (the PolicyServer's reader,
    its error as this API's)."""
    try:
        return await read_limited(request, limit)
    except APIError as exc:
        raise OpError(f"{exc.message.rstrip('.')} (--max-body-mb)", status=exc.status) from None


def unzstd(body: bytes, limit: int) -> bytes:
    """A zstd body decompressed (every frame), refused (413) once it passes ``limit`` bytes: a small
    body can decompress to a huge one."""
    import zstandard

    reader = zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True)
    chunks, size = [], 0
    try:
        while True:
            chunk = reader.read(min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            size += len(chunk)
            if size > limit:
                raise OpError(
                    f"the decompressed forward_backward body is more than {limit} bytes; this server takes "
                    f"at most {limit} (--max-body-mb)",
                    status=413,
                )
            chunks.append(chunk)
    except zstandard.ZstdError as exc:
        raise OpError(
            f"the forward_backward body is not valid zstd (Content-Encoding: zstd): {exc}"
        ) from None
    return b"".join(chunks)


async def read_json(request: Request, limit: int) -> dict[str, Any]:
    """The request's JSON object (413 past ``limit`` bytes; a clear error for anything else)."""
    raw = await read_body(request, limit)
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpError(f"the request body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise OpError(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def _fingerprint(body: bytes | dict[str, Any]) -> str:
    """What tells a retried submission (the same body) from another client's request."""
    raw = body if isinstance(body, bytes) else json.dumps(body, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()


def _tokens(model_input: Any) -> list[int]:
    """The token ids of a JSON ``ModelInput`` (encoded text chunks only)."""
    chunks = model_input.get("chunks") if isinstance(model_input, dict) else None
    if not isinstance(chunks, list):
        raise OpError(f"prompt must be a ModelInput object with 'chunks', got {model_input!r}")
    out: list[int] = []
    for chunk in chunks:
        kind = chunk.get("type") if isinstance(chunk, dict) else None
        if kind != "encoded_text":
            raise OpError(f"prompt has a {kind!r} chunk: this server takes encoded_text chunks only")
        tokens = chunk.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise OpError("an encoded_text chunk needs 'tokens': a list of token ids")
        out.extend(tokens)
    return out


class TinkerAPI:
    """The handlers of one Tinker server over ``backend``; ``poll_s``: how long ``/retrieve_future``
    holds a request for an unfinished operation before answering ``try_again``; ``recorder``: where
    the training and sampling calls are recorded (default: an in-memory store)."""

    def __init__(
        self,
        backend: TrainingBackend,
        registry: Registry,
        poll_s: float = 30.0,
        sample_workers: int = 16,
        recorder: Recorder | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes must be at least 1, got {max_body_bytes}")
        self.max_body_bytes = int(max_body_bytes)
        self.backend = backend
        self.registry = registry
        self.recorder = recorder if recorder is not None else Recorder(MemoryStore())
        self.poll_s = float(poll_s)
        self.table = FutureTable()
        self.queue = OrderedQueue(self.table)
        self.samplers = concurrent.futures.ThreadPoolExecutor(
            sample_workers, thread_name_prefix="agl-tinker-sample"
        )

    def close(self) -> None:
        self.queue.close()
        self.samplers.shutdown(wait=False, cancel_futures=True)
        self.recorder.close()

    def _recorded(
        self, model_id: str, name: str, fn: Callable[[], Outcome], **attributes: Any
    ) -> Callable[[], Outcome]:
        """``fn``, its run recorded as a span of ``model_id``'s rollout (its metrics and the weight
        version after it; or the error it raised)."""

        def run() -> Outcome:
            start = time.time()
            try:
                outcome = fn()
            except Exception as exc:
                why = str(exc) if isinstance(exc, OpError) else f"{type(exc).__name__}: {exc}"
                self.recorder.training_op(model_id, name, start, attributes, error=why)
                raise
            extra: dict[str, Any] = {"weights_version": self.backend.weights_version()}
            metrics = (outcome.json or {}).get("metrics")
            if metrics:
                extra["metrics"] = dict(metrics)
            self.recorder.training_op(model_id, name, start, {**attributes, **extra})
            return outcome

        return run

    def routes(self) -> list[Route]:
        post = {
            "client/config": self.client_config,
            "create_session": self.create_session,
            "session_heartbeat": self.heartbeat,
            "telemetry": self.telemetry,
            "sessions/{session_id}/finish": self.finish,
            "create_model": self.create_model,
            "get_info": self.get_info,
            "forward_backward": self.forward_backward,
            "optim_step": self.optim_step,
            "save_weights": self.save_weights,
            "save_weights_for_sampler": self.save_weights_for_sampler,
            "load_weights": self.load_weights,
            "create_sampling_session": self.create_sampling_session,
            "asample": self.asample,
            "retrieve_future": self.retrieve_future,
            "weights_info": self.weights_info,
        }
        get = {
            "healthz": self.healthz,
            "get_server_capabilities": self.capabilities,
            "samplers/{sampler_id}": self.get_sampler,
            "training_runs/{run_id}": self.training_run,
        }
        out = [Route(f"/api/v1/{p}", self._wrap(h), methods=["POST"]) for p, h in post.items()]
        out += [Route(f"/api/v1/{p}", self._wrap(h), methods=["GET"]) for p, h in get.items()]
        return out

    @staticmethod
    def _wrap(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except OpError as exc:
                status = exc.status or (
                    404 if str(exc).startswith("unknown") or str(exc).startswith("no checkpoint") else 422
                )
                return error(str(exc), status, exc.category)
            except ClientDisconnect:  # the client went away mid-request: nothing was queued
                logger.info(
                    "Tinker server: a client disconnected before its %s request was read", request.url.path
                )
                return error("the client disconnected before the request body was read", 400)
            except Exception as exc:  # a bug: said (and logged with its traceback), never a bare 500
                logger.exception("Tinker server: %s failed", request.url.path)
                return error(
                    f"the server failed on {request.url.path}: {type(exc).__name__}: {exc}", 500, "server"
                )

        return run

    # -- sessions -------------------------------------------------------------------------------
    async def client_config(self, request: Request) -> Response:
        # one fwd/bwd chunk at a time, in order; no JWT exchange; plain protobuf bodies
        return JSONResponse(
            {"pjwt_auth_enabled": False, "parallel_fwdbwd_chunks": False, "proto_compress_fwdbwd": False}
        )

    async def create_session(self, request: Request) -> Response:
        await read_json(request, self.max_body_bytes)
        return JSONResponse({"type": "create_session", "session_id": self.registry.new_session()})

    async def heartbeat(self, request: Request) -> Response:
        self.registry.check_session((await read_json(request, self.max_body_bytes)).get("session_id"))
        return JSONResponse({"type": "session_heartbeat"})

    async def telemetry(self, request: Request) -> Response:
        return JSONResponse({"status": "accepted"})

    async def finish(self, request: Request) -> Response:
        session = self.registry.check_session(request.path_params["session_id"])
        raw = await read_body(request, self.max_body_bytes)
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            body = {}  # a finish without a readable body still finishes
        reason = body.get("reason") if isinstance(body, dict) else None
        kind = reason.get("type") if isinstance(reason, dict) else None
        detail = body.get("detail") if isinstance(body, dict) else None
        why = f"the client ended the session: {kind or 'no reason given'}" + (
            f" ({detail})" if detail else ""
        )
        for model in [m for m, s in list(self.registry.models.items()) if s == session]:
            self.queue.forget(model, "the session finished")
        await asyncio.to_thread(self.recorder.finish_session, session, kind == "success", why)
        return JSONResponse({})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def capabilities(self, request: Request) -> Response:
        return JSONResponse(
            {"supported_models": [{"model_name": n} for n in self.backend.base_model_names()]}
        )

    # -- futures --------------------------------------------------------------------------------
    def _future(self, request_id: str, **extra: Any) -> Response:
        return JSONResponse({"request_id": request_id, **extra})

    async def retrieve_future(self, request: Request) -> Response:
        rid = (await read_json(request, self.max_body_bytes)).get("request_id")
        if not isinstance(rid, str):
            raise OpError(f"request_id must be a string, got {rid!r}")
        try:
            outcome = await self.table.wait(rid, self.poll_s)
        except KeyError:
            raise OpError(f"unknown request_id {rid!r}: this server never issued it (or forgot it)") from None
        if outcome is None:
            return JSONResponse({"type": "try_again", "request_id": rid, "queue_state": "active"})
        if outcome.proto is not None and PROTO in request.headers.get("accept", ""):
            return Response(outcome.proto, media_type=PROTO)
        return JSONResponse(outcome.body())

    def _in_thread(self, fn: Callable[[], Outcome], **extra: Any) -> Response:
        rid = self.table.create()
        self.samplers.submit(self.table.run, rid, fn)
        return self._future(rid, **extra)

    # -- models ---------------------------------------------------------------------------------
    async def create_model(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        session = self.registry.check_session(body.get("session_id"))
        lora = body.get("lora_config") or {}
        if not isinstance(lora, dict):
            raise OpError(f"lora_config must be an object, got {lora!r}")
        base_model = body.get("base_model")
        if base_model not in self.backend.base_model_names():
            raise OpError(
                f"base_model {base_model!r} is not served here; this server trains "
                f"{self.backend.base_model_names()}"
            )
        model_id = self.registry.model_id(session, body.get("model_seq_id"))
        rank, seed = lora.get("rank", 32), lora.get("seed")
        flags = {k: lora.get(k, True) for k in LORA_FLAGS}  # Tinker's defaults: all three true
        self.queue.open(model_id)

        def create() -> Outcome:
            self.backend.create_model(model_id, str(base_model), rank, seed, **flags)
            self.recorder.training_model(model_id, str(base_model), rank, session)
            return Outcome(json={"type": "create_model", "model_id": model_id})

        return self._future(self.queue.submit(None, None, create), model_id=model_id)

    async def get_info(self, request: Request) -> Response:
        model_id = self.registry.check_model((await read_json(request, self.max_body_bytes)).get("model_id"))
        info = self.backend.info(model_id)
        return JSONResponse(
            {
                "type": "get_info",
                "model_id": model_id,
                "model_data": {"model_name": info.base_model, "tokenizer_id": info.tokenizer_id},
                "is_lora": True,
                "lora_rank": info.lora_rank,
                "model_name": info.base_model,
            }
        )

    # -- training -------------------------------------------------------------------------------
    async def forward_backward(self, request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != PROTO:
            raise OpError(
                f"forward_backward takes a protobuf body (Content-Type: {PROTO}), as SDK 0.38 sends"
            )
        body = await read_body(request, self.max_body_bytes)
        if request.headers.get("content-encoding", "") == "zstd":
            body = await asyncio.to_thread(unzstd, body, self.max_body_bytes)
        req = decode_forward_backward_request(body)
        model_id = self.registry.check_model(req.model_id)

        def run() -> Outcome:
            result = self.backend.forward_backward(
                model_id, req.data, req.loss_fn, req.loss_fn_config, req.forward_only
            )
            body = {
                "loss_fn_output_type": "ArrayRecord",
                "loss_fn_outputs": [
                    {k: {"data": v, "dtype": "float32", "shape": [len(v)]} for k, v in out.items()}
                    for out in result.outputs
                ],
                "metrics": result.metrics,
            }
            return Outcome(json=body, proto=encode_forward_backward_output(result))

        op = "forward" if req.forward_only else "forward_backward"
        attrs = {
            "seq_id": req.seq_id,
            "loss_fn": req.loss_fn,
            "num_datums": len(req.data),
            "num_tokens": sum(d.length for d in req.data),
        }
        run = self._recorded(model_id, op, run, **attrs)
        return self._future(
            self.queue.submit(model_id, req.seq_id, run, _fingerprint(body)), model_id=model_id
        )

    async def optim_step(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        model_id = self.registry.check_model(body.get("model_id"))
        if body.get("optimizer_params") is not None and body.get("adam_params") is None:
            raise OpError("only AdamW (adam_params) is served here, not optimizer_params")
        adam = adam_params(body.get("adam_params") or {})

        def step() -> Outcome:
            metrics = self.backend.optim_step(model_id, adam)
            return Outcome(json={"type": "optim_step", "metrics": metrics})

        seq = body.get("seq_id")
        step = self._recorded(model_id, "optim_step", step, seq_id=seq, adam_params=dataclasses.asdict(adam))
        return self._future(self.queue.submit(model_id, seq, step, _fingerprint(body)), model_id=model_id)

    # -- weights --------------------------------------------------------------------------------
    async def save_weights(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        model_id = self.registry.check_model(body.get("model_id"))
        name = self.registry.check_name(body.get("path"))
        directory = self.registry.directory_of(model_id, "weights", name)
        if directory.exists() and body.get("overwrite") is False:
            raise OpError(f"a checkpoint named {name!r} already exists (pass overwrite=True)")

        def save() -> Outcome:
            self.backend.save_state(model_id, directory, optimizer=True)
            path = self.registry.tinker_path(model_id, "weights", name)
            return Outcome(json={"type": "save_weights", "path": path})

        save = self._recorded(model_id, "save_weights", save, seq_id=body.get("seq_id"), checkpoint=name)
        return self._future(
            self.queue.submit(model_id, body.get("seq_id"), save, _fingerprint(body)), model_id=model_id
        )

    async def save_weights_for_sampler(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        model_id = self.registry.check_model(body.get("model_id"))
        name = body.get("path")
        base = self.backend.info(model_id).base_model
        if name is None:  # ephemeral: a sampling session, no path

            def snapshot() -> Outcome:
                sampler = self.backend.save_for_sampler(model_id, None)
                sid = self.registry.add_sampling(sampler, base)
                return Outcome(json={"type": "save_weights_for_sampler", "sampling_session_id": sid})

            snapshot = self._recorded(
                model_id, "save_weights_for_sampler", snapshot, seq_id=body.get("seq_id")
            )
            return self._future(
                self.queue.submit(model_id, body.get("seq_id"), snapshot, _fingerprint(body)),
                model_id=model_id,
            )
        directory = self.registry.directory_of(model_id, "sampler_weights", self.registry.check_name(name))
        path = self.registry.tinker_path(model_id, "sampler_weights", name)

        def save() -> Outcome:
            sampler = self.backend.save_for_sampler(model_id, directory)
            sid = self.registry.add_sampling(sampler, base, path)
            return Outcome(
                json={"type": "save_weights_for_sampler", "path": path, "sampling_session_id": sid}
            )

        save = self._recorded(
            model_id, "save_weights_for_sampler", save, seq_id=body.get("seq_id"), path=path
        )
        return self._future(
            self.queue.submit(model_id, body.get("seq_id"), save, _fingerprint(body)), model_id=model_id
        )

    async def load_weights(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        directory = self.registry.existing(body.get("path"))
        optimizer = bool(body.get("optimizer", False))
        if body.get("model_id") is not None:  # into an existing model, in its seq_id order
            model_id = self.registry.check_model(body.get("model_id"))

            def load() -> Outcome:
                self.backend.load_state(model_id, directory, optimizer)
                return Outcome(json={"type": "load_weights", "path": body["path"], "model_id": model_id})

            load = self._recorded(
                model_id, "load_weights", load, seq_id=body.get("seq_id"), path=body["path"]
            )
            return self._future(
                self.queue.submit(model_id, body.get("seq_id"), load, _fingerprint(body)), model_id=model_id
            )
        session = self.registry.check_session(body.get("session_id"))
        saved = self.backend.saved_info(directory)
        model_id = self.registry.model_id(session, body.get("model_seq_id"))
        base = self.backend.base_model_names()[0]
        rank = saved["lora_rank"]
        self.queue.open(model_id)

        def create_and_load() -> Outcome:
            self.backend.create_model(model_id, base, rank, None, **{k: saved[k] for k in LORA_FLAGS})
            self.recorder.training_model(model_id, base, rank, session)
            start = time.time()
            try:
                self.backend.load_state(model_id, directory, optimizer)
            except Exception as exc:
                self.recorder.training_op(model_id, "load_weights", start, {"path": body["path"]}, str(exc))
                raise
            self.recorder.training_op(model_id, "load_weights", start, {"path": body["path"]})
            return Outcome(json={"type": "load_weights", "path": body["path"], "model_id": model_id})

        return self._future(self.queue.submit(None, None, create_and_load), model_id=model_id)

    # -- sampling -------------------------------------------------------------------------------
    async def create_sampling_session(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        self.registry.check_session(body.get("session_id"))
        base_names = self.backend.base_model_names()
        path = body.get("model_path")
        if path is not None:
            directory = self.registry.existing(path)
            sampler = await asyncio.to_thread(self.backend.load_sampler, directory)
            sid = self.registry.add_sampling(sampler, base_names[0], path)
        else:
            base = body.get("base_model")
            if base not in base_names:
                raise OpError(f"base_model {base!r} is not served here; this server samples {base_names}")
            sid = self.registry.add_sampling(None, base_names[0])
        return JSONResponse({"type": "create_sampling_session", "sampling_session_id": sid})

    async def get_sampler(self, request: Request) -> Response:
        s = self.registry.sampling_session(request.path_params["sampler_id"])
        return JSONResponse(
            {"sampler_id": s.session_id, "base_model": s.base_model, "model_path": s.model_path}
        )

    async def asample(self, request: Request) -> Response:
        body = await read_json(request, self.max_body_bytes)
        info: dict[str, Any] = {"base_model": self.backend.base_model_names()[0]}
        if body.get("sampling_session_id") is not None:
            found = self.registry.sampling_session(body.get("sampling_session_id"))
            sampler = found.sampler
            info.update(sampling_session_id=found.session_id, model_path=found.model_path)
        elif body.get("base_model") is not None:
            if body["base_model"] not in self.backend.base_model_names():
                raise OpError(f"base_model {body['base_model']!r} is not served here")
            sampler = None
        else:
            raise OpError("asample needs a sampling_session_id (or a base_model)")
        for unsupported in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(unsupported):
                raise OpError(f"{unsupported} is not supported by this server")
        if body.get("target_prompt_logprobs") is not None:
            raise OpError("target_prompt_logprobs is not supported by this server")
        prompt = _tokens(body.get("prompt"))
        n = body.get("num_samples", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_SAMPLES:
            raise OpError(f"num_samples must be an integer from 1 to {MAX_SAMPLES}, got {n!r}")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise OpError(f"sampling_params must be an object, got {type(params).__name__}")
        want_prompt = bool(body.get("prompt_logprobs"))
        stamp = f"{time.monotonic_ns():x}"

        ids = [f"seq-{stamp}-{i}" for i in range(n)]
        info["sample_sequence_ids"] = ids

        def run() -> Outcome:
            start = time.time()
            try:
                seqs = self.backend.sample(sampler, prompt, params, n)
                prompt_lp = self.backend.prompt_logprobs(sampler, prompt) if want_prompt else None
            except Exception as exc:
                why = str(exc) if isinstance(exc, OpError) else f"{type(exc).__name__}: {exc}"
                self.recorder.sample(start, prompt, params, info, error=why)
                raise
            self.recorder.sample(start, prompt, params, info, seqs, prompt_lp)
            out = {
                "type": "sample",
                "sequences": [
                    {"tokens": s.tokens, "logprobs": s.logprobs, "stop_reason": s.stop_reason} for s in seqs
                ],
                "prompt_logprobs": prompt_lp,
            }
            return Outcome(json=json.loads(json.dumps(out)), proto=encode_sample_response(seqs, prompt_lp))

        return self._in_thread(run, sample_sequence_ids=ids)

    # -- checkpoints ----------------------------------------------------------------------------
    async def training_run(self, request: Request) -> Response:
        run_id = self.registry.check_model(request.path_params["run_id"])
        info = self.backend.info(run_id)
        return JSONResponse(
            {
                "training_run_id": run_id,
                "base_model": info.base_model,
                "model_owner": "local",
                "is_lora": True,
                "lora_rank": info.lora_rank,
                **{k: getattr(info, k) for k in LORA_FLAGS},
                "corrupted": False,
                "last_request_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )

    async def weights_info(self, request: Request) -> Response:
        path = (await read_json(request, self.max_body_bytes)).get("tinker_path")
        directory = self.registry.existing(path)
        saved = self.backend.saved_info(directory)
        base = self.backend.base_model_names()[0]
        return JSONResponse({"base_model": base, "is_lora": True, **saved})
