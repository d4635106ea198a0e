"""LoRA / QLoRA adapter settings, and attaching them to a transformers model with peft."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._compat import quiet_upstream_warnings

quiet_upstream_warnings()

__all__ = ["LoRA", "attach_lora", "check_4bit_available", "prepare_4bit"]


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

    def quantization_config(self, compute_dtype: Any = None) -> Any:
        """The ``transformers.BitsAndBytesConfig`` that QLoRA loads the base model with: 4-bit NF4
        weights, double quantisation, matmuls in ``compute_dtype`` (default bfloat16).

        >>> agl.LoRA(load_in_4bit=True).quantization_config().bnb_4bit_quant_type  # doctest: +SKIP
        'nf4'
        """
        import torch
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=compute_dtype or torch.bfloat16,
        )

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


def check_4bit_available(device: Any = None) -> None:
    """Raise a clear error unless 4-bit QLoRA can run here: a CUDA GPU, ``bitsandbytes``, and (when
    given) ``device`` a CUDA device.

    >>> import torch
    >>> try:
    ...     check_4bit_available("cpu")  # the weights would have to go to a CUDA device
    ... except RuntimeError as exc:
    ...     print("CUDA" in str(exc))
    True
    """
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "LoRA(load_in_4bit=True) is QLoRA, which needs a CUDA GPU (bitsandbytes' 4-bit kernels) and none "
            "is visible to torch (torch.cuda.is_available() is False; a CPU-only torch build, or no driver). "
            "On a CPU use LoRA(load_in_4bit=False); on a GPU machine install the CUDA build of torch"
        )
    if device is not None and torch.device(device).type != "cuda":
        raise RuntimeError(
            "LoRA(load_in_4bit=True) puts the 4-bit base weights on a CUDA device, "
            f"got device={str(device)!r}: use device='auto' or 'cuda'"
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise RuntimeError(
            "LoRA(load_in_4bit=True) is QLoRA, which needs bitsandbytes: pip install bitsandbytes "
            "(or pip install 'agentlightning-lite[qlora]'); without it use LoRA(load_in_4bit=False) "
            "(bf16 base weights: about 4x the weight memory)"
        ) from None


def prepare_4bit(model: Any) -> Any:
    """Make a 4-bit (bitsandbytes) model trainable through LoRA: norms and the head in float32, the
    base frozen (peft's ``prepare_model_for_kbit_training``). Gradient checkpointing is left to
    ``UpdateConfig(gradient_checkpointing=...)``."""
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def attach_lora(model: Any, lora: LoRA) -> Any:
    """Wrap ``model`` with a fresh trainable adapter (a ``peft.PeftModel``)."""
    from peft import get_peft_model

    if lora.load_in_4bit:
        check_4bit_available()
        model = prepare_4bit(model)
    return get_peft_model(model, lora.to_peft_config())
