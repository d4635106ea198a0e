"""Small helpers of the training process: gradient checkpointing, memory figures, the step bar."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch

from ._memory import available_mib, estimate_update_peak_mib, limit_heap_retention, peak_rss_mib, rss_mib

logger = logging.getLogger(__name__)

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


def memory_is_short(model: Any, update_config: Any, micro_batch_tokens: int, autocast: Any = None) -> bool:
    """Whether the update's estimated activations (:func:`._memory.estimate_update_peak_mib` for a
    micro-batch of ``micro_batch_tokens``) pass ``update_config.memory_budget`` of the memory
    available now; logged once with the figures. Unknown available memory: not short."""
    need = estimate_update_peak_mib(model, micro_batch_tokens, autocast)
    have = available_mib()
    if have is None:
        return need == float("inf")
    budget = update_config.memory_budget * have
    short = need > budget
    logger.info(
        "update memory: about %.0f MiB of activations per micro-batch of %d tokens against a budget "
        "of %.0f MiB (%.0f%% of %.0f MiB available): %s",
        need,
        micro_batch_tokens,
        budget,
        100 * update_config.memory_budget,
        have,
        "gradient checkpointing and the 1 MiB mmap threshold on" if short else "no memory savers needed",
    )
    return short


def prepare_update_memory(
    model: Any, update_config: Any, micro_batch_tokens: int = 2048, autocast: Any = None
) -> bool:
    """What :class:`~.config.UpdateConfig` says about memory, applied once when a trainer starts:
    gradient checkpointing on ``model`` and glibc's mmap threshold for host memory, each either as
    set or, left to ``None`` / ``"auto"``, on when :func:`memory_is_short`. Returns whether
    checkpointing is on."""
    auto_ckpt = update_config.gradient_checkpointing is None
    auto_mmap = update_config.host_mmap_threshold_mib == "auto"
    short = (auto_ckpt or auto_mmap) and memory_is_short(model, update_config, micro_batch_tokens, autocast)
    mmap = update_config.host_mmap_threshold_mib
    if auto_mmap:
        mmap = 1.0 if short else None
    if mmap is not None:
        limit_heap_retention(float(mmap))
    wanted = update_config.gradient_checkpointing
    if wanted is None:  # on where memory is short and the model supports it
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        wanted = short and bool(getattr(base, "supports_gradient_checkpointing", False))
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
