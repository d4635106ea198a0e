"""The Tinker-compatible server: the routes of :mod:`.routes` over a training backend, run by uvicorn in
a background thread (``agl-lite tinker`` runs it in the foreground).

Point the official SDK at it with ``TINKER_BASE_URL=http://HOST:PORT`` and any key that starts with
``tml-`` (``TINKER_API_KEY=tml-local``; the SDK refuses others). With ``api_key=`` set, requests must
carry that key (``X-API-Key``, as the SDK sends it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import models
from ..serving.threaded import ThreadedUvicorn
from ..store.base import Store
from ..store.sqlite import SQLiteStore
from .backend import TrainingBackend
from .recording import Recorder
from .registry import Registry
from .routes import MAX_BODY_BYTES, TinkerAPI

__all__ = ["STORE_FILE", "TinkerServer", "base_model_names", "build_backend", "tokenizer_id"]

STORE_FILE = "store.sqlite"  #: the store under ``output_dir`` when none is given
VLLM_MAX_LORA_RANK = 64  #: the largest LoRA rank a vLLM-backed server takes unless told otherwise
KEEP_SAMPLERS = 8  #: how many unnamed sampler snapshots stay loaded


def base_model_names(model: str) -> list[str]:
    """The names a client may give as ``base_model`` for ``model``: a known model's Hugging Face id
    first (what ``get_info`` reports), then the name it was started with, then the local directory
    :func:`tokenizer_id` names (so a client that loads its tokenizer from that directory, such as a
    tinker-cookbook recipe given ``model_name=<directory>``, can name the model by it too).

    >>> base_model_names("smollm2-135m")  # doctest: +SKIP
    ['HuggingFaceTB/SmolLM2-135M-Instruct', 'smollm2-135m', '/root/.cache/.../safetensors']
    >>> base_model_names("/models/tiny")
    ['/models/tiny']
    """
    spec = models.KNOWN_MODELS.get(model.lower())
    names = [spec.hf_id, model] if spec is not None else [model]
    directory = tokenizer_id(model)
    return names if directory in names else [*names, directory]


def tokenizer_id(model: str) -> str:
    """What ``get_info`` names as the tokenizer: a directory that loads offline (a known model's
    converted directory, a local model directory) or else the name itself (a Hugging Face id)."""
    if model.lower() in models.KNOWN_MODELS:
        return str(models.safetensors_dir(model))
    path = Path(model).expanduser()
    return str(path.resolve()) if path.is_dir() else model


def build_backend(
    model: str = "smollm2-135m",
    engine: str = "hf",
    *,
    output_dir: str | os.PathLike[str] | None = None,
    vllm_options: dict[str, Any] | None = None,
    **engine_options: Any,
) -> TrainingBackend:
    """The training backend for ``model`` on ``engine``.

    ``"hf"``: transformers in this process trains each LoRA adapter in place and samples from it
    (``engine_options`` go to ``HFEngine``). ``"vllm"``: a vLLM server samples (started here, or the one
    at ``vllm_options["url"]``, with its ``max_lora_rank``; ``vllm_options`` go to ``VLLMEngine``) while a
    transformers copy of the
    same weights trains (``engine_options`` go to its ``HFEngine``); each sampler's adapter is saved
    under ``output_dir/samplers`` (a temporary directory without ``output_dir``) and loaded by vLLM.

    >>> build_backend("smollm2-135m", "vllm", output_dir="runs/tinker")  # doctest: +SKIP
    <agentlightning_lite.tinker.peft_backend.PeftBackend object at ...>
    """
    if engine not in ("hf", "vllm"):
        raise ValueError(f"the Tinker server runs on engine 'hf' or 'vllm', got engine={engine!r}")
    from ..serving.engines import HFEngine
    from .peft_backend import PeftBackend

    names, tokenizer = base_model_names(model), tokenizer_id(model)
    if engine == "hf":
        return PeftBackend(HFEngine(model, **engine_options), names, tokenizer)
    from ..rl.engine_setup import VLLM_GPU_SHARE
    from ..serving.engines import VLLMEngine

    if (vllm_options or {}).get("url") is not None and "max_lora_rank" not in (vllm_options or {}):
        raise ValueError(
            "attaching to a running vLLM (url=) needs its max_lora_rank= (the server's --max-lora-rank; "
            "vLLM's default is 16): ranks above it cannot be sampled"
        )
    trainer = HFEngine(model, **engine_options)
    options: dict[str, Any] = {"max_lora_rank": VLLM_MAX_LORA_RANK, **(vllm_options or {})}
    options.setdefault("dtype", str(trainer.dtype).removeprefix("torch."))  # vLLM computes as the trainer
    options.setdefault("max_loras", 4)
    options.setdefault("max_cpu_loras", KEEP_SAMPLERS + 4)  # the snapshots kept, and a few being replaced
    if next(trainer.model.parameters()).device.type == "cuda":
        options.setdefault("gpu_memory_utilization", VLLM_GPU_SHARE)  # the rest is the trainer's
    if output_dir is not None:
        options.setdefault("log_dir", str(Path(output_dir).absolute() / "vllm-logs"))
    try:
        sampler = VLLMEngine(model, **options)
    except BaseException:
        trainer.close()
        raise
    samplers = None if output_dir is None else Path(output_dir).absolute() / "samplers"
    try:
        return PeftBackend(
            sampler,
            names,
            tokenizer,
            keep_samplers=KEEP_SAMPLERS,
            trainer=trainer,
            sampler_dir=samplers,
            max_lora_rank=int(options["max_lora_rank"]),
        )
    except BaseException:
        sampler.close()
        trainer.close()
        raise


class TinkerServer(ThreadedUvicorn):
    """Serve the Tinker API over ``backend`` at ``http://host:port/api/v1``.

    Args:
        backend: the training side (:func:`build_backend`, or any :class:`~.backend.TrainingBackend`).
        output_dir: where ``tinker://`` checkpoints are written, and the store (``store.sqlite``)
            unless ``store`` is given.
        store: where every training and sampling call is recorded (:mod:`.recording`): each training
            model a rollout with a span per operation, each ``sample`` call a rollout with its ``llm``
            spans. Default: an ``agl.SQLiteStore`` at ``<output_dir>/store.sqlite`` (closed with the
            server; a store passed in is left open).
        api_key: require this key (``X-API-Key`` or ``Authorization: Bearer``); ``None``: no key.
        poll_s: how long ``/retrieve_future`` waits for an unfinished operation before it answers
            ``try_again`` (Tinker clients time out after 45 s).
        max_body_bytes: the largest request body, a zstd ``forward_backward`` body once decompressed
            too; a larger one gets a 413 that says the limit (default 256 MiB).

    >>> import agentlightning_lite.tinker as tk  # doctest: +SKIP
    >>> backend = tk.build_backend("smollm2-135m")  # doctest: +SKIP
    >>> with tk.TinkerServer(backend, "runs/tinker", port=8000) as server:  # doctest: +SKIP
    ...     print(server.url)  # TINKER_BASE_URL for the SDK (with TINKER_API_KEY=tml-anything)
    http://127.0.0.1:8000
    """

    _label = "Tinker server"
    _thread_name = "agl-tinker"

    def __init__(
        self,
        backend: TrainingBackend,
        output_dir: str | os.PathLike[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        poll_s: float = 30.0,
        log_level: str = "warning",
        store: Store | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        super().__init__(host, port, log_level)
        self.backend = backend
        self.registry = Registry(Path(output_dir))
        self._owns_store = store is None
        if store is None:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            store = SQLiteStore(Path(output_dir) / STORE_FILE)
        self.store: Store = store
        self.api = TinkerAPI(
            backend, self.registry, poll_s=poll_s, recorder=Recorder(store), max_body_bytes=max_body_bytes
        )
        self.api_key = api_key
        self.app = Starlette(
            routes=self.api.routes(), middleware=[Middleware(BaseHTTPMiddleware, dispatch=self._check_key)]
        )

    async def _check_key(self, request: Request, call_next: Any) -> Response:
        if self.api_key is not None and request.url.path != "/api/v1/healthz":
            given = request.headers.get("x-api-key")
            bearer = request.headers.get("authorization", "")
            if given is None and bearer.lower().startswith("bearer "):
                given = bearer[7:]
            if given != self.api_key:
                why = "no API key given" if given is None else "wrong API key"
                return JSONResponse(
                    {"error": f"{why}: this server requires its --api-key as X-API-Key", "category": "user"},
                    status_code=401,
                )
        response: Response = await call_next(request)
        return response

    def stop(self, timeout: float = 10.0) -> None:
        super().stop(timeout)

    def close(self) -> None:
        """Stop serving and release the worker threads and the backend."""
        self.stop()
        self.api.close()
        self.backend.close()
        if self._owns_store:
            self.store.close()
