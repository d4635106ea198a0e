"""PPO with a value head on the policy backbone: GAE over each call's response tokens.

Each policy call (a transition) is a single-turn episode whose tokens are the actions: the call's
credited reward arrives at its last response token, the value head estimates the return at every
token, and GAE (Schulman et al. 2016) turns both into per-token advantages. As in CleanRL's
``ppo.py``, every equation is one line you can point at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from .grpo import LossAggregation

__all__ = ["PPO", "ValueHead", "gae", "value_loss"]


@dataclass
class PPO:
    """Every PPO knob in one place (shared knobs mean what they mean in :class:`GRPO`).

    Args:
        gamma: discount between response tokens of one call (1.0: undiscounted, as usual for LLMs).
        lam: GAE lambda.
        vf_coef: weight of the value loss.
        vf_clip: clip range of the value update (PPO2 style); ``None`` disables it.
        whiten_advantages: normalise advantages over the batch's response tokens.
        group_size: rollouts per task (PPO does not need groups; >1 gives more samples per task).

    >>> import agentlightning_lite as agl
    >>> agl.PPO(lam=0.95, vf_coef=0.1).gamma
    1.0
    """

    group_size: int = 1
    clip: float = 0.2
    clip_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k3"] = "k3"
    lr: float = 1e-5
    value_lr: float | None = None
    weight_decay: float = 0.0
    epochs: int = 2
    mini_batch_size: int | None = None
    micro_batch_size: int = 8
    micro_batch_tokens: int = 2048
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.1
    vf_clip: float | None = 0.2
    whiten_advantages: bool = True
    loss_agg: LossAggregation = "token-mean"
    max_response_tokens: int = 512
    eps: float = 1e-6

    def __post_init__(self) -> None:
        if not 0 < self.clip < 1:
            raise ValueError(f"clip must be in (0, 1), got {self.clip}")
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError("gamma and lam must be in [0, 1]")
        if self.group_size < 1 or self.micro_batch_size < 1 or self.epochs < 1:
            raise ValueError("group_size, micro_batch_size and epochs must be >= 1")


class ValueHead(nn.Module):
    """A linear value estimate on the backbone's last hidden state, one value per token."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.v = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.v.weight)
        nn.init.zeros_(self.v.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.v(hidden).squeeze(-1)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    gamma: float,
    lam: float,
    segments: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over each row's masked tokens (right-padded rows).

    ``delta_t = r_t + gamma * V_{t+1} - V_t`` (``V`` after the last token is 0);
    ``A_t = delta_t + gamma * lam * A_{t+1}``; returns ``R_t = A_t + V_t``.
    An episode ends where the mask ends or, with ``segments`` (trajectory mode: one id per call),
    where the call changes, so each call of a merged row is its own episode, as it is alone.

    >>> import torch
    >>> r = torch.tensor([[0.0, 0.0, 1.0]]); v = torch.tensor([[0.5, 0.5, 0.5]])
    >>> adv, ret = gae(r, v, torch.ones(1, 3), gamma=1.0, lam=1.0)
    >>> adv.tolist(), ret.tolist()
    ([[0.5, 0.5, 0.5]], [[1.0, 1.0, 1.0]])
    >>> adv, _ = gae(r, v, torch.ones(1, 3), 1.0, 1.0, segments=torch.tensor([[1, 2, 2]]))
    >>> adv.tolist()  # the first call ends at its token: V after it is 0
    [[-0.5, 0.5, 0.5]]
    """
    mask = mask.to(values.dtype)
    values = values * mask
    cont = mask[:, 1:]  # 1 where token t + 1 continues token t's episode
    if segments is not None:
        cont = cont * (segments[:, 1:] == segments[:, :-1]).to(values.dtype)
    adv = torch.zeros_like(values)
    last = torch.zeros(values.shape[0], dtype=values.dtype, device=values.device)
    for t in range(values.shape[1] - 1, -1, -1):
        c = cont[:, t] if t + 1 < values.shape[1] else torch.zeros_like(last)
        next_v = values[:, t + 1] * c if t + 1 < values.shape[1] else torch.zeros_like(last)
        delta = rewards[:, t] + gamma * next_v - values[:, t]
        last = delta + gamma * lam * last * c
        last = last * mask[:, t]
        adv[:, t] = last
    return adv, adv + values


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Per-token ``0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)`` (unclipped if ``clip`` is None)."""
    err = (values - returns) ** 2
    if clip is None:
        return 0.5 * err
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * torch.maximum(err, (clipped - returns) ** 2)
