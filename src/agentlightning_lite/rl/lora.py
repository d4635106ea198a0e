"""LoRA / QLoRA adapter settings, and attaching them to a transformers model with peft."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["LoRA", "attach_lora", "check_4bit_available"]


@dataclass
class LoRA:
    """Low-rank adapter settings (Hu et al. 2021); ``load_in_4bit=True`` gives QLoRA (GPU only).

    Args:
        r: rank of the update matrices.
        alpha: scaling numerator (the update is scaled by ``alpha / r``).
        dropout: dropout on the adapter input.
        target_modules: module names to adapt (the attention and MLP projections of Llama-style
            models by default); ``"all-linear"`` adapts every linear layer.
        load_in_4bit: quantise the frozen base weights to 4-bit NF4 with bitsandbytes (QLoRA,
            Dettmers et al. 2023). Needs a CUDA GPU and ``bitsandbytes``; a clear error otherwise.

    >>> import agentlightning_lite as agl
    >>> cfg = agl.LoRA(r=8, alpha=16).to_peft_config()
    >>> cfg.r, cfg.lora_alpha, cfg.task_type
    (8, 16, 'CAUSAL_LM')
    """

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] | str = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    load_in_4bit: bool = False

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError("LoRA rank r must be >= 1")
        if not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")

    def to_peft_config(self) -> Any:
        """The equivalent ``peft.LoraConfig``."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=self.target_modules,
            bias="none",
            task_type="CAUSAL_LM",
        )


def check_4bit_available() -> None:
    """Raise a clear error unless 4-bit QLoRA can run here (CUDA GPU and bitsandbytes)."""
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "LoRA(load_in_4bit=True) is QLoRA, which needs a CUDA GPU (bitsandbytes 4-bit kernels); "
            "on a CPU use LoRA(load_in_4bit=False)"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError("QLoRA needs bitsandbytes: pip install bitsandbytes") from None


def attach_lora(model: Any, lora: LoRA) -> Any:
    """Wrap ``model`` with a fresh trainable adapter (a ``peft.PeftModel``)."""
    from peft import get_peft_model, prepare_model_for_kbit_training

    if lora.load_in_4bit:
        check_4bit_available()
        model = prepare_model_for_kbit_training(model)
    return get_peft_model(model, lora.to_peft_config())
