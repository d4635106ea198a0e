"""The vLLM engine (GPU, optional): token ids and logprobs from vLLM itself, LoRA hot-swapped per version.

By default each request goes to vLLM's async engine as it arrives (continuous batching: a request is
admitted while others are decoding). Written against vLLM 0.8 to 0.11 (``vllm.AsyncLLMEngine``,
``vllm.AsyncEngineArgs``, ``vllm.LLM``, ``vllm.SamplingParams``, ``vllm.lora.request.LoRARequest``).
vLLM is imported only when a ``VLLMEngine`` is built, so the SDK works without it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ... import models
from ..structured import ResponseFormat, ResponseFormatError
from .base import BatchingEngine, GenRequest, GenResult

logger = logging.getLogger(__name__)

__all__ = ["SUPPORTED_VLLM", "VLLMEngine", "vllm_available"]

#: the vLLM versions this engine was written against (the ``vllm`` extra pins the same range)
SUPPORTED_VLLM = ">=0.8,<0.12"

INSTALL_HINT = (
    "VLLMEngine needs vLLM (a CUDA GPU and Linux): pip install 'agentlightning-lite[vllm]' "
    "(or pip install vllm). Without a GPU, use agl.engines.HFEngine."
)


def vllm_available() -> bool:
    """Whether vLLM can be imported here.

    >>> isinstance(vllm_available(), bool)
    True
    """
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _import_vllm() -> tuple[Any, Any]:
    """``(vllm, LoRARequest)``, or an ImportError that says how to install vLLM."""
    try:
        import vllm
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return vllm, LoRARequest


class VLLMEngine(BatchingEngine):
    """Serve a model with vLLM, optionally through a LoRA adapter that training replaces in place.

    Args:
        model: a Hugging Face id or local directory; ``"smollm2-135m"`` maps to its original
            Hugging Face repository (vLLM applies LoRA to unquantised weights, not the GGUF).
        lora: a directory holding a peft adapter to serve from the start, or ``None``.
        enable_lora: reserve LoRA slots even without an initial adapter (default: True).
        max_lora_rank: the largest adapter rank vLLM must accept.
        adapter_dir: where adapter versions given as state dicts are written (default: a temp dir).
        adapters: named adapters, each a directory holding a peft adapter, e.g. one per agent
            (``{"writer": "runs/init/writer", "rewriter": "runs/init/rewriter"}``); vLLM's
            multi-LoRA serves them together (``max_loras`` defaults to their number).
        routes: which adapter serves which agent (``None``: the base model); see
            :meth:`~agentlightning_lite.serving.engines.base.Engine.set_routes`.
        continuous_batching: ``True`` (default): every request goes to vLLM's async engine
            (``vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(...))``) the moment it
            arrives, and vLLM's scheduler admits it into the running batch at its next step, so an
            agent's turn never waits for other agents' replies to finish. ``False``: requests that
            arrive together go to one blocking ``vllm.LLM.generate`` call (fixed batches).
        **llm_kwargs: passed to ``vllm.AsyncEngineArgs`` (or ``vllm.LLM``): ``gpu_memory_utilization``,
            ``max_model_len``, ``logprobs_mode``... vLLM reports raw logprobs (before temperature)
            by default.

    A request's ``response_format`` goes to vLLM's own structured outputs, as vLLM's OpenAI server
    passes it on: ``json_object`` as ``json_object=True``, ``json_schema`` as ``json=<schema>``, in
    ``SamplingParams(structured_outputs=StructuredOutputsParams(...))`` (vLLM 0.10.2 and later) or
    ``SamplingParams(guided_decoding=GuidedDecodingParams(...))`` (earlier). vLLM picks its backend
    (``structured_outputs_config`` / ``guided_decoding_backend`` engine arguments) and checks the schema.

    Each request carries its agent's ``LoRARequest``. After :meth:`update_weights` the requests
    admitted from then on use a new ``LoRARequest`` (a fresh id per version), so vLLM loads the
    new adapter without a restart; requests already decoding finish on the version they started
    with (their result's ``weights_version`` says which), and the old adapter is removed from
    vLLM once none of them still uses it. Token ids and logprobs are vLLM's own, exactly.
    Written against vLLM ``SUPPORTED_VLLM`` (0.8 to 0.11).

    >>> engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct", lora="runs/adapter-0")  # doctest: +SKIP
    >>> engine.update_weights("runs/adapter-1")  # doctest: +SKIP
    1
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        lora: str | os.PathLike[str] | None = None,
        enable_lora: bool = True,
        max_lora_rank: int = 64,
        model_name: str | None = None,
        max_batch_size: int = 256,
        batch_window_s: float = 0.005,
        adapter_dir: str | None = None,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
        routes: Mapping[str, str | None] | None = None,
        continuous_batching: bool = True,
        **llm_kwargs: Any,
    ) -> None:
        vllm, lora_request_cls = _import_vllm()
        super().__init__(max_batch_size=max_batch_size, batch_window_s=batch_window_s)
        self._vllm = vllm
        self._lora_request_cls = lora_request_cls
        spec = models.KNOWN_MODELS.get(str(model).lower())
        target = spec.hf_id if spec is not None else str(model)
        self.model_name = model_name or str(model)
        named = dict(adapters or {})
        if lora is not None:
            if "default" in named:
                raise ValueError("lora= is the adapter named 'default': do not name another one so")
            named = {"default": lora, **named}
        self.enable_lora = bool(enable_lora or named)
        kwargs = dict(llm_kwargs)
        self.continuous_batching = bool(continuous_batching)
        if self.enable_lora:
            kwargs.setdefault("enable_lora", True)
            kwargs.setdefault("max_lora_rank", max_lora_rank)
            # every adapter resident at once; with continuous batching, during a hand-over the old and
            # the new version of each are (requests still decoding on the old one finish on it)
            kwargs.setdefault("max_loras", max(1, len(named)) * (2 if self.continuous_batching else 1))
        self.model_id = target
        self.llm_kwargs = dict(kwargs)
        self.llm: Any = None
        self.async_engine: Any = None
        self._aloop: asyncio.AbstractEventLoop | None = None
        self._in_flight: dict[int, int] = {}  # LoRA id -> requests decoding with it
        self._retired: dict[int, Any] = {}  # replaced LoRARequests still in use, by id
        if self.continuous_batching:
            self._start_async(vllm, target, kwargs)
        else:
            self.llm = vllm.LLM(model=target, **kwargs)
            self.tokenizer = self.llm.get_tokenizer()
        self.max_context = self._max_model_len(kwargs.get("max_model_len"))
        self._adapter_dir = adapter_dir
        self._lora_paths: dict[str, str] = {}
        self.lora_requests: dict[str, Any] = {}
        self._next_lora_id = 1
        for name, path in named.items():
            self._set_adapter(str(path), name)
        if routes is not None:
            self.set_routes(routes)

    @property
    def adapters(self) -> list[str]:
        return list(self.lora_requests)

    def _own_adapter(self) -> str | None:
        return next(iter(self.lora_requests), None)

    @property
    def lora_request(self) -> Any:
        """The ``LoRARequest`` of the engine's first (or only) adapter, or ``None``."""
        name = self._own_adapter()
        return None if name is None else self.lora_requests[name]

    @property
    def _lora_path(self) -> str | None:
        name = self._own_adapter()
        return None if name is None else self._lora_paths[name]

    def _max_model_len(self, given: int | None) -> int:
        if given:
            return int(given)
        try:
            if self.async_engine is not None:
                config = getattr(self.async_engine, "model_config", None)  # V1 AsyncLLM
                if config is None:  # the V0 AsyncLLMEngine wraps an LLMEngine
                    config = self.async_engine.engine.model_config
                return int(config.max_model_len)
            return int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            return 8192

    # -- the async engine -----------------------------------------------------------------
    def _start_async(self, vllm: Any, target: str, kwargs: dict[str, Any]) -> None:
        """Build ``vllm.AsyncLLMEngine`` on an event loop of its own (a daemon thread)."""
        # only the final output of each request (not one cumulative copy per step) where vLLM offers it
        kinds = getattr(getattr(vllm, "sampling_params", None), "RequestOutputKind", None)
        self._final_only = getattr(kinds, "FINAL_ONLY", None)
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name="agl-vllm-async", daemon=True)
        thread.start()
        self._aloop, self._aloop_thread = loop, thread

        async def build() -> tuple[Any, Any]:
            engine = vllm.AsyncLLMEngine.from_engine_args(vllm.AsyncEngineArgs(model=target, **kwargs))
            tok = engine.get_tokenizer()
            if inspect.isawaitable(tok):  # a coroutine in vLLM 0.8-0.10
                tok = await tok
            return engine, tok

        try:
            self.async_engine, self.tokenizer = self._call(build())
        except BaseException:
            self._stop_loop()
            raise

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the engine's event loop and wait for its result."""
        assert self._aloop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._aloop).result(timeout)

    def _stop_loop(self) -> None:
        if self._aloop is not None:
            self._aloop.call_soon_threadsafe(self._aloop.stop)
            self._aloop_thread.join(timeout=10)
            self._aloop.close()
            self._aloop = None

    def submit(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        """Start one generation; with continuous batching it joins vLLM's running batch at once.

        Cancelling the returned future aborts the request in vLLM (its KV cache is freed)."""
        if not self.continuous_batching:
            return super().submit(request)
        if self._closed or self._aloop is None:
            raise RuntimeError(f"{type(self).__name__} is closed")
        with self.lock:  # the adapter version is fixed at admission
            name = self._adapter_of(request)
            if name is not None and name not in self.lora_requests:
                raise KeyError(f"unknown adapter {name!r}: this engine serves {self.adapters}")
            lora = None if name is None else self.lora_requests[name]
            version = self.version
            if lora is not None:
                self._in_flight[lora.lora_int_id] = self._in_flight.get(lora.lora_int_id, 0) + 1
        return asyncio.run_coroutine_threadsafe(self._agenerate(request, lora, version, name), self._aloop)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        if not self.continuous_batching:
            return super().generate(requests)
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    async def _agenerate(self, req: GenRequest, lora: Any, version: int, name: str | None) -> GenResult:
        request_id = f"{req.request_id or 'agl'}-{uuid.uuid4().hex[:12]}"
        t0 = time.perf_counter()
        final = None
        params = self.sampling_params(req)
        if self._final_only is not None:
            params.output_kind = self._final_only
        try:
            async for output in self.async_engine.generate(
                {"prompt_token_ids": list(req.prompt_token_ids)},
                params,
                request_id,
                lora_request=lora,
            ):
                final = output  # cumulative: the last output holds every token and logprob
        except asyncio.CancelledError:
            await self.async_engine.abort(request_id)
            raise
        finally:
            if lora is not None:
                await self._release(lora)
        if final is None:
            raise RuntimeError(f"vLLM returned no output for request {request_id}")
        result = self._result(req, final, version, name)
        self._record_batch([req], [result], time.perf_counter() - t0)
        return result

    async def _release(self, lora: Any) -> None:
        """One request is done with ``lora``; remove a replaced adapter from vLLM after its last one."""
        with self.lock:
            lid = lora.lora_int_id
            self._in_flight[lid] = self._in_flight.get(lid, 1) - 1
            done = self._in_flight[lid] <= 0 and lid in self._retired
            if self._in_flight[lid] <= 0:
                del self._in_flight[lid]
            if done:
                del self._retired[lid]
        if done:
            await self._remove_lora(lid)

    async def _remove_lora(self, lora_int_id: int) -> None:
        try:  # vLLM would evict it anyway: a failure here only costs a slot until then
            result = self.async_engine.remove_lora(lora_int_id)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.debug("vLLM clean-up step failed (best effort)", exc_info=True)

    # -- LoRA -----------------------------------------------------------------------------
    def _set_adapter(self, path: str, name: str) -> None:
        if not self.enable_lora:
            raise RuntimeError("this VLLMEngine was built with enable_lora=False")
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise FileNotFoundError(f"{path} is not a peft adapter directory (no adapter_config.json)")
        old = self.lora_requests.get(name)
        lora_id = self._next_lora_id  # vLLM caches adapters by id: a new id per version forces a reload
        self._next_lora_id += 1
        label = "policy" if name == "default" else name
        self.lora_requests[name] = self._lora_request_cls(f"{label}-v{self.version}", lora_id, path)
        self._lora_paths[name] = path
        if old is None:
            return
        if self.async_engine is not None:  # remove it now, or after the last request decoding with it
            if self._in_flight.get(old.lora_int_id, 0) > 0:
                self._retired[old.lora_int_id] = old
            else:
                asyncio.run_coroutine_threadsafe(self._remove_lora(old.lora_int_id), self._aloop)  # type: ignore[arg-type]
            return
        try:  # free the old slot; vLLM would evict it anyway
            self.llm.llm_engine.remove_lora(old.lora_int_id)
        except Exception:
            logger.debug("vLLM clean-up step failed (best effort)", exc_info=True)

    def _write_adapter(self, state: Mapping[str, Any], name: str) -> str:
        if name not in self._lora_paths:
            raise RuntimeError(
                f"a state dict needs an initial adapter {name!r} (lora=... or adapters=...) to take its "
                "adapter_config.json from"
            )
        from safetensors.torch import save_file

        root = self._adapter_dir or tempfile.mkdtemp(prefix="agl-vllm-lora-")
        self._adapter_dir = root
        sub = f"v{self.version + 1}" if name == "default" else os.path.join(name, f"v{self.version + 1}")
        path = os.path.join(root, sub)
        os.makedirs(path, exist_ok=True)
        shutil.copy(os.path.join(self._lora_paths[name], "adapter_config.json"), path)
        tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
        return path

    def update_weights(
        self, source: str | os.PathLike[str] | Mapping[str, Any], adapter: str | None = None
    ) -> int:
        """Serve new adapter weights from the next batch on; returns the new ``version``.

        ``source`` is a directory holding a saved peft adapter (``model.save_pretrained(dir)``)
        or the adapter's state dict (written next to a copy of the first adapter's config).
        ``adapter`` names which adapter it replaces (default: the engine's first).
        """
        with self.lock:
            name = adapter or self._own_adapter() or "default"
            if isinstance(source, Mapping):
                path = self._write_adapter(source, name)
            elif isinstance(source, (str, os.PathLike)):
                path = str(source)
            else:
                raise TypeError("VLLMEngine.update_weights takes an adapter directory or a state dict")
            self.version += 1
            try:
                self._set_adapter(path, name)
            except BaseException:
                self.version -= 1
                raise
            return self.version

    # -- generation -----------------------------------------------------------------------
    def _structured(self, fmt: ResponseFormat) -> tuple[str, Any]:
        """The ``SamplingParams`` keyword and value that ask vLLM to enforce ``fmt``."""
        module = getattr(self._vllm, "sampling_params", None)
        fields = {"json_object": True} if fmt.type == "json_object" else {"json": fmt.json_schema()}
        cls = getattr(module, "StructuredOutputsParams", None)
        if cls is not None:
            return "structured_outputs", cls(**fields)
        cls = getattr(module, "GuidedDecodingParams", None)
        if cls is not None:
            return "guided_decoding", cls(**fields)
        raise ResponseFormatError(
            "'response_format' is not supported by this vLLM "
            "(it has neither StructuredOutputsParams nor GuidedDecodingParams)"
        )

    def check_response_format(
        self, fmt: ResponseFormat, tools: Sequence[dict[str, Any]] | None = None
    ) -> None:
        self._structured(fmt)  # vLLM checks the schema itself when the request is added

    def sampling_params(self, req: GenRequest) -> Any:
        """The ``vllm.SamplingParams`` of one request (logprobs of the sampled token always on)."""
        extra = dict([self._structured(req.response_format)]) if req.response_format is not None else {}
        return self._vllm.SamplingParams(
            n=1,
            temperature=float(req.temperature),
            top_p=float(req.top_p),
            max_tokens=int(req.max_tokens),
            stop=list(req.stop) or None,
            seed=req.seed,
            logprobs=int(req.top_logprobs),  # 0: just the sampled token's logprob
            skip_special_tokens=True,
            **extra,
        )

    def _generate_batch(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        with self.lock:
            names = [self._adapter_of(r) for r in requests]
            unknown = sorted({n for n in names if n is not None and n not in self.lora_requests})
            if unknown:
                raise KeyError(f"unknown adapter(s) {unknown}: this engine serves {self.adapters}")
            loras = [None if n is None else self.lora_requests[n] for n in names]
            version = self.version
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        params = [self.sampling_params(r) for r in requests]
        # one LoRARequest for the whole batch, or a list with one per prompt (vLLM's multi-LoRA)
        lora = loras[0] if len(set(map(id, loras))) == 1 else loras
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        return [self._result(r, o, version, n) for r, o, n in zip(requests, outputs, names, strict=True)]

    @staticmethod
    def _result(req: GenRequest, output: Any, version: int, adapter: str | None = None) -> GenResult:
        c = output.outputs[0]
        token_ids = [int(t) for t in c.token_ids]
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        for tok, entry in zip(token_ids, c.logprobs or [], strict=False):
            logprobs.append(float(entry[tok].logprob))
            if req.top_logprobs:
                ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[: req.top_logprobs]
                tops.append([(int(t), float(lp.logprob)) for t, lp in ranked])
        if len(logprobs) != len(token_ids):
            raise RuntimeError("vLLM returned no logprobs for some tokens; is logprobs disabled?")
        finish = c.finish_reason if c.finish_reason in ("stop", "length") else "stop"
        return GenResult(
            prompt_token_ids=list(req.prompt_token_ids),
            token_ids=token_ids,
            logprobs=logprobs,
            text=c.text,
            finish_reason=finish,
            top_logprobs=tops if req.top_logprobs else None,
            stop_reason=getattr(c, "stop_reason", None),
            weights_version=version,
            adapter=adapter,
        )

    def close(self) -> None:
        """Stop the engine: requests still decoding are aborted, vLLM is shut down."""
        if self._closed:
            return
        super().close()
        if self.async_engine is not None and self._aloop is not None:

            async def abort_all() -> None:  # each cancelled request aborts itself in vLLM
                me = asyncio.current_task()
                tasks = [t for t in asyncio.all_tasks() if t is not me]
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            try:
                self._call(abort_all(), timeout=30)
            except Exception:
                logger.debug("vLLM clean-up step failed (best effort)", exc_info=True)
            shutdown = getattr(self.async_engine, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception:
                    logger.debug("vLLM clean-up step failed (best effort)", exc_info=True)
            self._stop_loop()

    def describe(self) -> str:
        """A one-line description: model, adapter and version."""
        return json.dumps(
            {
                "model": self.model_name,
                "continuous_batching": self.continuous_batching,
                "lora": self._lora_path,
                "adapters": self._lora_paths,
                "version": self.version,
            }
        )
