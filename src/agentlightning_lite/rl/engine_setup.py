"""Engine set-up: the engine that serves the policy, and the model the optimiser updates.

``engine="auto"`` is vLLM on a GPU when it is installed, else transformers (:func:`choose_engine`).
A transformers engine (``HFEngine``) trains in place: its module is the training model. vLLM cannot:
a transformers copy trains and hands its adapters over after each update (:mod:`.weights`); vLLM starts
from that copy's fresh adapters, so both begin from the same weights. Under a launcher only rank 0
starts (or attaches to) vLLM: the other ranks train their copy behind a :class:`NotServing` engine.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ..lora_settings import check_4bit_available
from ..serving.engines.base import Engine, GenRequest, GenResult
from ..serving.engines.contract import InPlaceEngine, MultiAdapterEngine, ServingEngine
from .checkpoint import save_adapter
from .distributed import detect
from .policies import PolicyPlan

__all__ = ["NotServing", "build_engine", "choose_engine", "training_model", "update_autocast"]

VLLM_GPU_SHARE = 0.45  # of the GPU for vLLM by default: the rest is the training copy's


def has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def choose_engine(engine: str) -> str:
    """``"hf"`` or ``"vllm"`` for an engine name (``"auto"``: vLLM on a GPU when installed)."""
    if engine == "auto":
        return "vllm" if torch.cuda.is_available() and has_vllm() else "hf"
    if engine not in ("hf", "vllm"):
        raise ValueError(f"engine must be 'auto', 'hf', 'vllm' or an engine instance, got {engine!r}")
    return engine


class NotServing(Engine):
    """The engine of a rank other than 0 under a launcher when a separate server (vLLM) serves: rank 0
    alone starts (or attaches to) that server, runs the rollouts and hands it each adapter; this rank
    only trains its transformers copy (``copy``), whose tokenizer and context it reports.

    >>> from agentlightning_lite.serving.engines import ScriptedEngine
    >>> NotServing(ScriptedEngine(["hi"], tokenizer="bytes"), rank=1).version
    0
    """

    def __init__(self, copy: Any, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.tokenizer = copy.tokenizer
        self.model_name = copy.model_name
        self.max_context = copy.max_context

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        raise RuntimeError(
            f"rank {self.rank} serves nothing: under a launcher, rank 0 runs the rollouts and its server "
            "serves them (the other ranks only train)"
        )


def _adapters(plan: PolicyPlan) -> dict[str, Any]:
    """HFEngine keyword arguments that give it the plan's adapters (the shared plan: its ``lora``)."""
    return {"lora": plan.lora} if plan.shared else {"adapters": plan.adapter_specs()}


def _attach(engine: ServingEngine, plan: PolicyPlan) -> ServingEngine:
    """Give an engine instance the plan's adapters and routes (the shared plan: the engine's own adapter)."""
    if plan.shared:
        return engine
    if not isinstance(engine, MultiAdapterEngine):
        raise TypeError(
            f"policies= needs an engine that serves several adapters; {type(engine).__name__} "
            "cannot (pass engine='hf', engine='vllm' or an agl.engines.HFEngine)"
        )
    for name, spec in plan.adapter_specs().items():
        engine.add_adapter(name, spec)
    engine.set_routes(plan.routes, default=None)
    return engine


def build_engine(
    engine: str | ServingEngine,
    model: Any,
    plan: PolicyPlan,
    *,
    seed: int,
    concurrency: int,
    options: Mapping[str, Any],
    output_dir: Path,
) -> tuple[ServingEngine, Any]:
    """The serving engine for ``plan`` and, for vLLM, the transformers copy that trains (else ``None``).

    ``options`` are keyword arguments for an engine built from a name.
    """
    from ..serving import engines as eng

    if plan.lora.load_in_4bit:
        check_4bit_available()
    if not isinstance(engine, str):
        return _attach(engine, plan), None
    kind = choose_engine(engine)
    routes: dict[str, Any] = {} if plan.shared else {"routes": plan.routes}
    if kind == "hf":
        hf_options = {"seed": seed, "max_batch_size": max(16, concurrency), **options}
        return eng.HFEngine(model, **_adapters(plan), **routes, **hf_options), None
    # vLLM serves; a transformers copy trains. vLLM starts from the copy's fresh adapters.
    copy = eng.HFEngine(model, **_adapters(plan), seed=seed)
    launch = detect()
    if launch is not None and not launch.is_main:  # rank 0 alone starts or attaches to the servers
        return NotServing(copy, launch.rank), copy
    # absolute: vLLM reads every adapter path against its own working directory (a relative one it then
    # takes for a Hugging Face repository id)
    output_dir = Path(output_dir).absolute()
    init = output_dir / "adapter-init"
    if plan.shared:
        copy.model.save_pretrained(str(init))
        served: dict[str, Any] = {"lora": str(init)}
    else:
        inits = {name: str(save_adapter(copy.model, name, init / name)) for name in plan.trained}
        served = {"adapters": {**inits, **plan.frozen}}
    vllm_options = {
        "max_lora_rank": max(16, *(lo.r for lo in plan.trained.values())),
        "gpu_memory_utilization": VLLM_GPU_SHARE,
        "adapter_dir": str(output_dir / ("adapters" if plan.shared else "adapters-served")),
        "dtype": str(copy.dtype).removeprefix("torch."),  # vLLM computes in the trainer's dtype
        **options,
    }
    return eng.VLLMEngine(model, **served, **routes, **vllm_options), copy


def training_model(engine: ServingEngine, copy: Any, model: Any, plan: PolicyPlan, seed: int) -> Any:
    """The peft model the optimiser updates: an in-place engine's own module, else a transformers copy's."""
    if isinstance(engine, InPlaceEngine):
        module = engine.model
        if hasattr(module, "peft_config") and isinstance(module, torch.nn.Module):
            return module  # train in place: the engine serves the updated adapter at once
    if copy is None:
        from ..serving import engines as eng

        copy = eng.HFEngine(model, **_adapters(plan), seed=seed)
    return copy.model


def update_autocast(engine: ServingEngine, device: torch.device) -> Any:
    """The dtype the update computes in: the in-place engine's (``HFEngine(autocast=...)``), else bf16 on
    a CUDA device that supports it, else ``None`` (no autocast)."""
    dtype = engine.autocast_dtype if isinstance(engine, InPlaceEngine) else None
    if dtype is None and device.type == "cuda" and torch.cuda.is_bf16_supported():
        dtype = torch.bfloat16
    return dtype
