"""Builders the tests share: the tiny random-init Llama over the byte tokenizer, and LoRA weight snapshots.

Test modules import them relatively (``from .._helpers import tiny_llama``); the fixtures in
``tests/conftest.py`` (``tiny_llama``, ``tiny_engine``) are built on them.
"""

from __future__ import annotations

from typing import Any

#: the byte tokenizer's ids: 256 bytes, then <|im_start|> (256) and <|im_end|> (257, EOS and padding)
BYTE_VOCAB = 258
BYTE_EOS = 257


def tiny_llama(
    *,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    max_position_embeddings: int = 512,
    vocab_size: int = BYTE_VOCAB,
    **config: Any,
) -> Any:
    """A random-init ``LlamaForCausalLM`` (seed 0, eval mode) over the byte tokenizer's 258 ids.

    The defaults make a two-layer model of about 40k parameters that builds in milliseconds; any
    ``LlamaConfig`` field can be overridden. The same arguments give the same weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    options: dict[str, Any] = {"pad_token_id": BYTE_EOS, "eos_token_id": BYTE_EOS}
    options.update(config)
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        **options,
    )
    return LlamaForCausalLM(cfg).eval()


def lora_weights(model: Any, adapter: str | None = None) -> dict[str, Any]:
    """A detached copy of the LoRA matrices of ``model`` (a PEFT model or a trainer's ``policy``),
    by parameter name; only those of ``adapter`` when given."""
    return {
        n: p.detach().clone()
        for n, p in model.named_parameters()
        if "lora_" in n and (adapter is None or f".{adapter}." in n)
    }


def max_abs_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest absolute difference between two snapshots of the same parameters."""
    assert a.keys() == b.keys(), sorted(a.keys() ^ b.keys())
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def leave_after_launch() -> None:
    """End a worker started by a launcher (``WORLD_SIZE`` set) without the interpreter's teardown: after
    its process group is closed, a gloo rank sometimes aborts there ("terminate called without an
    active exception", 2 of 8 runs under load; pytorch/pytorch#179291)."""
    import os
    import sys

    if "WORLD_SIZE" in os.environ:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
