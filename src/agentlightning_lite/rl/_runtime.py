"""Small helpers of the training process: gradient checkpointing, memory figures, the step bar."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ._memory import limit_heap_retention, peak_rss_mib, rss_mib

__all__ = [
    "enable_gradient_checkpointing",
    "is_checkpointing",
    "memory_stats",
    "prepare_update_memory",
    "release_cuda_cache",
    "show_step",
]


def show_step(bar: Any, last: Mapping[str, Any]) -> None:
    """Advance a training bar (``None``: no bar) by one step, showing its reward and loss."""
    if bar is None:
        return
    bar.update(1)
    loss = last.get("train/loss")
    bar.set_postfix(
        reward=f"{last.get('train/reward_mean', float('nan')):.3f}",
        loss="skipped (no reward spread)" if loss is None else f"{loss:.4f}",
    )


def enable_gradient_checkpointing(model: Any) -> None:
    """Turn on transformers' gradient checkpointing under a peft model, non-reentrant: the reentrant
    variant needs an input that requires grad, which a frozen embedding of a LoRA model is not."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(base).__name__} does not support gradient checkpointing")
    kwargs = {"use_reentrant": False}
    if hasattr(base, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        base.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def prepare_update_memory(model: Any, update_config: Any) -> bool:
    """What :class:`~.config.UpdateConfig` says about memory, applied once when a trainer starts:
    gradient checkpointing on ``model`` and glibc's mmap threshold for host memory. Returns whether
    checkpointing is on."""
    if update_config.host_mmap_threshold_mib is not None:
        limit_heap_retention(update_config.host_mmap_threshold_mib)
    wanted = update_config.gradient_checkpointing
    if wanted is None:  # on where the model supports it
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        wanted = bool(getattr(base, "supports_gradient_checkpointing", False))
    if wanted:
        enable_gradient_checkpointing(model)
    return bool(wanted)


def is_checkpointing(model: Any) -> bool:
    """Whether gradient (activation) checkpointing is on in ``model`` (a peft model or not)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(base), name):
            return bool(getattr(base, name))
    return False


def memory_stats() -> dict[str, float]:
    """The process's resident size now (after the step's memory was released) and its peak so far."""
    now = rss_mib()
    return {"memory/peak_rss_mib": round(peak_rss_mib(), 1)} | (
        {} if now is None else {"memory/rss_mib": round(now, 1)}
    )


def release_cuda_cache(device: torch.device) -> None:
    """Return the CUDA caching allocator's free blocks (no-op elsewhere): after generation, the KV
    caches' blocks are of many sizes; giving them back lets the update allocate large contiguous ones."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
