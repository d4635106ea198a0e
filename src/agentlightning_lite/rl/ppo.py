"""PPO with a value head on the policy backbone: GAE over each call's response tokens.

Each policy call (a transition) is a single-turn episode whose tokens are the actions: the call's
credited reward arrives at its last response token, the value head estimates the return at every
token, and GAE (Schulman et al. 2016) turns both into per-token advantages. As in CleanRL's
``ppo.py``, every equation is one line you can point at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from .losses import value_loss
from .policy_gradient import PolicyGradient

if TYPE_CHECKING:
    from .batching import Sample, TokenBatch

__all__ = ["PPO", "gae", "value_loss"]


@dataclass
class PPO(PolicyGradient):
    """Every PPO knob in one place (shared knobs, validated once in
    :class:`~.policy_gradient.PolicyGradient`, mean what they mean in :class:`~.grpo.GRPO`).

    Args:
        group_size: rollouts per task (PPO does not need groups; >1 gives more samples per task).
        epochs: optimisation passes over each step's samples.
        value_lr: learning rate of the value head (``None``: ``lr``).
        gamma: discount between response tokens of one call (1.0: undiscounted, as usual for LLMs).
        lam: GAE lambda.
        vf_coef: weight of the value loss.
        vf_clip: clip range of the value update (PPO2 style); ``None`` disables it.
        whiten_advantages: normalise advantages over the batch's response tokens.

    >>> import agentlightning_lite as agl
    >>> agl.PPO(lam=0.95, vf_coef=0.1).gamma
    1.0
    """

    group_size: int = 1
    epochs: int = 2
    value_lr: float | None = None
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.1
    vf_clip: float | None = 0.2
    whiten_advantages: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"PPO: gamma and lam must be in [0, 1], got gamma={self.gamma}, lam={self.lam}")
        if self.value_lr is not None and not self.value_lr >= 0:
            raise ValueError(f"PPO: value_lr must be >= 0 or None, got {self.value_lr}")
        if self.vf_coef < 0 or (self.vf_clip is not None and not self.vf_clip > 0):
            raise ValueError(
                f"PPO: vf_coef must be >= 0 and vf_clip > 0 or None, got {self.vf_coef}, {self.vf_clip}"
            )

    @property
    def needs_values(self) -> bool:
        return True

    def value_head_lr(self) -> float:
        return self.value_lr or self.lr

    @property
    def value_coef(self) -> float:
        return self.vf_coef

    def value_loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor
    ) -> torch.Tensor:
        return value_loss(values, old_values, returns, self.vf_clip)

    def token_advantages(
        self,
        chunks: Sequence[Sequence[Sample]],
        batches: Sequence[TokenBatch],
        values: Sequence[torch.Tensor | None],
        merged: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """GAE over each call's tokens (its credited reward at its last token), then, with
        ``whiten_advantages``, normalised over every trained token of the step."""
        advs: list[torch.Tensor] = []
        rets: list[torch.Tensor | None] = []
        for c, b, v in zip(chunks, batches, values, strict=True):
            if v is None:
                raise ValueError("PPO needs the value head's values of every micro batch")
            rewards = torch.zeros(b.response_mask.shape)  # filled on the host, copied once
            for i, s in enumerate(c):  # each call's credit at its last token
                rewards[i, : len(s.response_ids)] = torch.tensor(s.token_rewards())
            rewards = rewards.to(b.response_mask.device)
            segs = b.segment_ids if merged else None
            a, r = gae(rewards, v, b.response_mask, self.gamma, self.lam, segs)
            advs.append(a)
            rets.append(r)
        if self.whiten_advantages:
            mask_all = torch.cat([b.response_mask.flatten() for b in batches]).bool()
            flat = torch.cat([a.flatten() for a in advs])[mask_all]
            mu, sd = flat.mean(), flat.std().clamp(min=1e-6) if flat.numel() > 1 else torch.tensor(1.0)
            advs = [((a - mu) / sd) * b.response_mask for a, b in zip(advs, batches, strict=True)]
        return advs, rets


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
