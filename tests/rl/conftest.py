"""Fixtures for the training tests: a tiny random-init Llama over the byte tokenizer's 258 ids."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def _tiny_llama(max_position_embeddings: int = 512) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=258,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=257,
        eos_token_id=257,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture
def tiny_llama() -> Callable[..., Any]:
    """A factory of the same seeded two-layer Llama (``max_position_embeddings`` 512 by default)."""
    pytest.importorskip("transformers")
    return _tiny_llama
