"""Transitions to tensors, and the per-token log-probabilities of their responses under the model.

Prompts are left-padded and responses right-padded so every response starts at the same column:
one ``logits_to_keep`` slice then holds exactly the logits that predict the response tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Sample", "TokenBatch", "collate", "forward_logprobs"]


@dataclass
class Sample:
    """One policy call ready for the update."""

    prompt_ids: list[int]
    response_ids: list[int]
    engine_logprobs: list[float] | None
    reward: float
    group: Any
    temperature: float = 1.0
    advantage: float = 0.0
    rollout_id: str = ""
    index: int = 0
    agent: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class TokenBatch:
    """Padded tensors for a list of samples (``R`` = longest response)."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    position_ids: torch.Tensor  # [B, P + R]
    response_ids: torch.Tensor  # [B, R]
    response_mask: torch.Tensor  # [B, R], 1 on real response tokens
    temperature: torch.Tensor  # [B]
    response_len: int

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.position_ids.to(device),
            self.response_ids.to(device),
            self.response_mask.to(device),
            self.temperature.to(device),
            self.response_len,
        )


def collate(samples: Sequence[Sample], pad_id: int) -> TokenBatch:
    """Left-pad prompts and right-pad responses into one :class:`TokenBatch`."""
    p_max = max(len(s.prompt_ids) for s in samples)
    r_max = max(max(len(s.response_ids) for s in samples), 1)
    b = len(samples)
    input_ids = torch.full((b, p_max + r_max), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_max + r_max), dtype=torch.long)
    resp = torch.full((b, r_max), pad_id, dtype=torch.long)
    rmask = torch.zeros((b, r_max), dtype=torch.float32)
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, p_max - p : p_max] = torch.tensor(s.prompt_ids, dtype=torch.long)
        attn[i, p_max - p : p_max] = 1
        if r:
            input_ids[i, p_max : p_max + r] = torch.tensor(s.response_ids, dtype=torch.long)
            attn[i, p_max : p_max + r] = 1
            resp[i, :r] = torch.tensor(s.response_ids, dtype=torch.long)
            rmask[i, :r] = 1.0
    position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
    temps = torch.tensor([s.temperature if s.temperature > 0 else 1.0 for s in samples], dtype=torch.float32)
    return TokenBatch(input_ids, attn, position_ids, resp, rmask, temps, r_max)


def forward_logprobs(
    model: Any,
    batch: TokenBatch,
    value_head: Any = None,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities ``[B, R]`` of the response tokens, ``log_softmax(logits / T)``.

    With ``value_head``, also the values ``[B, R]`` at the same positions (the state before each
    response token). Gradients flow unless the caller wraps this in ``torch.no_grad()``.
    """
    r = batch.response_len
    ctx = (
        torch.autocast(device_type=batch.input_ids.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else nullcontext()
    )
    with ctx:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=r + 1,
            output_hidden_states=value_head is not None,
            use_cache=False,
        )
    logits = out.logits[:, :-1, :].float()  # [B, R, V]: the logits that predict each response token
    logits = logits / batch.temperature[:, None, None]
    logp = torch.log_softmax(logits, dim=-1).gather(-1, batch.response_ids[..., None]).squeeze(-1)
    values = None
    if value_head is not None:
        hidden = out.hidden_states[-1][:, -(r + 1) : -1, :].float()
        values = value_head(hidden)
    return logp, values
