"""FSDP2 (``torch.distributed.fsdp.fully_shard``) of the frozen base model under a data-parallel update.

With :func:`shard_base` each rank keeps ``1/N`` of every decoder layer's frozen weights and gathers a
layer's full weights only while that layer runs (forward, and again in the backward), so a base model
larger than one device's memory can be trained with LoRA on N devices. The LoRA matrices (every
parameter that requires a gradient), the input and output embeddings and PPO's value head stay whole
on every rank: their gradients are summed by :meth:`.DataParallel.all_reduce_grads` exactly as without
sharding, so a sharded update takes the same step as an unsharded one.

A sharded layer's all-gather is a collective: every rank must run the same number of forward and
backward passes. The update gives each rank its share of a mini batch's micro-batches, which can be
uneven (5 micro-batches on 2 ranks: 3 and 2), so a rank with fewer runs the difference as idle passes
(one token, zero loss) before the gradients are summed (:meth:`.DataParallel.mine` counts them;
``dist/idle_passes`` reports them).

Supported: a ``peft`` LoRA model over a transformers decoder whose layers are a ``ModuleList``
(``model.model.layers``: Llama, Qwen2/3, Mistral, Gemma, Phi-3, SmolLM...; ``transformer.h``: GPT-2
style), in float32 or bfloat16, on CUDA (NCCL) or CPU (gloo), with the update and SFT. Not
supported: 4-bit (QLoRA) base weights (bitsandbytes' packed ``Params4bit`` are not sharded here:
:class:`.DistributedError`), and generation from the sharded model outside a collective (rank 0's
in-process serving in ``Trainer.fit``); generate from an engine with its own copy of the weights.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from .distributed import DataParallel, DistributedError

__all__ = ["decoder_layers", "shard_base"]

log = logging.getLogger(__name__)


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks of a (``peft``-wrapped) causal LM: the ``ModuleList`` of its decoder.

    >>> from tests._helpers import tiny_llama  # doctest: +SKIP
    >>> len(decoder_layers(tiny_llama()))  # doctest: +SKIP
    2
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for path in ("model.layers", "transformer.h", "model.decoder.layers", "gpt_neox.layers"):
        obj: Any = base
        for name in path.split("."):
            obj = getattr(obj, name, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList) and len(obj) > 0:
            return list(obj)
    raise DistributedError(
        f"cannot shard {type(base).__name__}: no decoder layers found (looked for model.layers, "
        "transformer.h, model.decoder.layers, gpt_neox.layers)"
    )


def _check_not_4bit(model: Any) -> None:
    for name, p in model.named_parameters():
        if type(p).__name__ in ("Params4bit", "Int8Params"):
            raise DistributedError(
                f"shard_base does not shard bitsandbytes-quantised weights ({name} is {type(p).__name__}): "
                "QLoRA with FSDP2 is not supported; use LoRA(load_in_4bit=False) with shard_base, or "
                "QLoRA without sharding"
            )


def shard_base(
    model: Any,
    data_parallel: DataParallel | None = None,
    *,
    reshard_after_forward: bool = True,
) -> Any:
    """Shard the frozen decoder layers of ``model`` across the ranks with FSDP2; returns ``model``.

    Call it on every rank, after the LoRA adapter is attached and the model is on this rank's device
    (``data_parallel.device``), before the optimiser is built. ``data_parallel`` (default: this
    process's active one) is told to keep the ranks' forward/backward passes in step. Trainable
    parameters, the input/output embeddings and everything outside the decoder layers stay whole on
    every rank. ``reshard_after_forward=False`` keeps each layer gathered from its forward to its
    backward (less communication, more memory).

    >>> dp = DataParallel.from_env()  # doctest: +SKIP
    >>> model = shard_base(attach_lora(load_model("smollm2-135m"), LoRA(r=16)), dp)  # doctest: +SKIP
    >>> cfg = UpdateSettings(dp.device, data_parallel=dp)  # doctest: +SKIP
    >>> optimise(model, samples, GRPO(), optimizer, None, cfg)  # every rank; LoRA trained  # doctest: +SKIP
    """
    from torch.distributed.fsdp import fully_shard

    _check_not_4bit(model)
    dp = data_parallel if data_parallel is not None else DataParallel.active()
    if dp is None:
        raise DistributedError(
            "shard_base needs several ranks: start the script with torchrun / accelerate launch "
            "(a single process has nothing to shard across)"
        )
    layers = decoder_layers(model)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    keep = {p for p in model.parameters() if p.requires_grad}
    for emb in (base.get_input_embeddings(), base.get_output_embeddings()):
        if emb is not None:
            keep.update(emb.parameters())
    wrong = {str(p.device) for p in model.parameters()} - {str(dp.device)}
    if wrong:
        raise DistributedError(
            f"move the model to {dp.device} before shard_base (found it on {sorted(wrong)})"
        )
    for layer in layers:
        fully_shard(layer, reshard_after_forward=reshard_after_forward, ignored_params=keep)
    parent = getattr(base, "model", None) or getattr(base, "transformer", None) or base
    fully_shard(parent, reshard_after_forward=reshard_after_forward, ignored_params=keep)
    dp.lockstep = lambda: _idle_pass(model, dp.device)
    sharded = sum(p.numel() for p in model.parameters() if p not in keep)
    log.info(
        "rank %d: %d decoder layers sharded across %d ranks (%d frozen parameters sharded, %d whole)",
        dp.rank, len(layers), dp.world_size, sharded, sum(p.numel() for p in keep),
    )  # fmt: skip
    return model


def _idle_pass(model: Any, device: torch.device) -> None:
    """One forward/backward on one token with a zero loss: the sharded layers' collectives of a
    micro-batch, for a rank that has fewer micro-batches than another in this mini batch."""
    ids = torch.zeros((1, 1), dtype=torch.long, device=device)
    out = model(input_ids=ids, use_cache=False)
    (out.logits.float().sum() * 0.0).backward()
