"""GRPO: group-relative advantages and the clipped policy-gradient loss, written out line by line.

LightningRL is hierarchical: credit assignment (``agl.credit``) first gives every policy call of an
episode a reward; then each call's response is a single-turn RL sample. GRPO (Shao et al. 2024,
DeepSeekMath) needs no value model: the advantage of a sample is its reward relative to the other
samples of the same task (the group of ``group_size`` rollouts of one task, all their calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from .advantages import group_advantages
from .policy_gradient import LossAggregation, PolicyGradient

if TYPE_CHECKING:
    from .batching import Sample

__all__ = [
    "GRPO",
    "LossAggregation",
    "PolicyGradient",
    "aggregate",
    "group_advantages",
    "kl_penalty",
    "policy_loss",
]


@dataclass
class GRPO(PolicyGradient):
    """Every GRPO knob in one place.

    Args:
        group_size: rollouts per task; advantages are normalised within each task's group.
        clip: PPO clip range epsilon: the ratio is kept in ``[1 - clip, 1 + clip_high or clip]``.
        clip_high: upper clip range ("clip-higher", DAPO, Yu et al. 2025); ``None`` = ``clip``.
        kl_coef: weight of the KL penalty against the reference policy (the base model with the
            adapter switched off: no second copy in memory); 0 disables it and skips its forward pass.
        kl_estimator: ``"k3"`` (Schulman's unbiased, always >= 0, as in GRPO) or ``"k1"`` (log ratio).
        lr: AdamW learning rate of the adapter (default 1e-4: LoRA RL at about ten times full
            fine-tuning's rate; the sweep that chose it is ``benchmarks/learning_rg/lr_sweep.md``).
        weight_decay: AdamW weight decay.
        epochs: optimisation passes over each step's samples (1 = on-policy).
        mini_batch_size: samples per optimiser step within an epoch (``None``: all at once).
        micro_batch_size: most samples per forward/backward (gradients accumulate up to a mini batch).
        micro_batch_tokens: most padded tokens per forward/backward: bounds the activation memory
            of the update (which grows with the tokens of a micro batch).
        max_grad_norm: gradient clipping by global norm.
        loss_agg: how token losses become one number:
            ``"token-mean"``: mean over all response tokens of the batch (DAPO);
            ``"seq-mean-token-mean"``: mean over each response's tokens, then over responses (GRPO);
            ``"seq-mean-token-sum-norm"``: each response's token sum divided by the constant
            ``max_response_tokens``, then mean over responses (Dr.GRPO: no length bias);
            ``"rollout-mean-token-mean"``: mean over each rollout's tokens (all its calls), then
            over rollouts: every rollout weighs the same, whatever its number of calls or tokens.
        max_response_tokens: the constant of ``seq-mean-token-sum-norm``.
        eps: added to the std before dividing.
        scale_rewards: divide by the group's std (``True`` or ``"group"``, GRPO), by the std of the
            whole batch's rewards (``"batch"``), or only subtract the group's mean (``False`` or
            ``"none"``, Dr.GRPO, Liu et al. 2025: the std division biases toward easy/hard tasks);
            TRL's ``GRPOConfig(scale_rewards=...)`` values.
        zero_spread: what a group whose rewards are all equal trains as. Its advantages are all 0,
            so it carries no signal: ``"drop"`` (default) leaves its calls out of the update (no
            compute; under ``token-mean`` their tokens no longer dilute the others'), ``"keep"``
            trains them with advantage 0 (TRL's behaviour). Counted as ``grpo/zero_std_groups``
            and ``samples/zero_spread_dropped``. With ``kl_coef > 0`` they are kept (the KL term
            still pulls on them).

    The knobs shared with :class:`~.ppo.PPO` live in :class:`~.policy_gradient.PolicyGradient`
    and are validated there, once.

    >>> import agentlightning_lite as agl
    >>> agl.GRPO(group_size=8, clip=0.2, kl_coef=0.0, lr=1e-5).loss_agg
    'token-mean'
    """

    scale_rewards: bool | Literal["group", "batch", "none"] = True
    zero_spread: Literal["drop", "keep"] = "drop"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.scale_rewards not in (True, False, "group", "batch", "none"):
            raise ValueError(
                "GRPO: scale_rewards must be True, False, 'group', 'batch' or 'none', "
                f"got {self.scale_rewards!r}"
            )
        if self.zero_spread not in ("drop", "keep"):
            raise ValueError(f"GRPO: zero_spread must be 'drop' or 'keep', got {self.zero_spread!r}")

    def advantages(self, samples: list[Sample]) -> dict[str, float]:
        """Group-relative advantages of the calls (:func:`group_advantages`), set on each sample;
        the calls of zero-spread groups are left out of the loss under ``zero_spread="drop"``."""
        adv, gstats = group_advantages(
            [s.reward for s in samples], [s.group for s in samples], scale=self.scale_rewards, eps=self.eps
        )
        for s, a in zip(samples, adv, strict=True):
            s.advantage = a
        stats = {f"grpo/{k}": v for k, v in gstats.items()}
        if all(a == 0.0 for a in adv):
            stats["train/skipped_update"] = 1.0  # every group had zero spread: no gradient
        elif self.zero_spread == "drop" and self.kl_coef == 0:
            spread: dict[object, bool] = {}
            for s, a in zip(samples, adv, strict=True):
                spread[s.group] = spread.get(s.group, False) or a != 0.0
            dropped = 0
            for s in samples:
                if not spread[s.group] and not s.meta.get("masked"):
                    s.meta["masked"] = True  # in no loss: see PolicyGradient.update's trained()
                    s.meta["zero_spread"] = True
                    dropped += 1
            stats["samples/zero_spread_dropped"] = float(dropped)
        return stats


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token PPO-clip surrogate (to be aggregated with :func:`aggregate`).

    ``ratio = exp(logp - old_logp)``;
    ``loss = -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A)``.
    ``advantages`` is one value per sequence (broadcast over its tokens) or per token.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    with torch.no_grad():
        m = mask.bool()
        stats = {
            # tokens where the clipped term is the smaller one: their gradient is cut
            "clip_frac": ((clipped < unclipped) & m).float().sum() / m.sum().clamp(min=1),
            "ratio_mean": ratio[m].mean() if m.any() else torch.tensor(1.0),
        }
    return loss, stats


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(policy || reference) estimate from sampled tokens.

    ``k1 = logp - ref_logp``; ``k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1`` (>= 0).
    """
    if estimator == "k1":
        return logp - ref_logp
    d = (ref_logp - logp).clamp(-20.0, 20.0)
    return torch.exp(d) - d - 1.0


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    max_tokens: int = 512,
    segments: torch.Tensor | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``[batch, tokens]`` to a scalar; see :class:`GRPO` ``loss_agg``.

    ``segments`` (``[batch, tokens]``, 1, 2, ... per call, 0 elsewhere) marks rows that hold several
    calls (trajectory mode): the ``seq-mean-*`` modes then treat each call as its own sequence, so a
    merged episode aggregates exactly as its calls would one by one. ``"rollout-mean-token-mean"``
    needs ``weights`` (``[batch, tokens]``, from :func:`~.policy_gradient.micro_batch_weights`: they
    know which rollout each row belongs to) and returns ``sum(loss * mask * weights)``.

    >>> import torch
    >>> loss, mask = torch.tensor([[1.0, 1.0], [4.0, 0.0]]), torch.tensor([[1, 1], [1, 0]])
    >>> [float(aggregate(loss, mask, m, max_tokens=2)) for m in
    ...  ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")]
    [2.0, 2.5, 1.5]
    >>> merged = torch.tensor([[1.0, 1.0, 9.0, 4.0]]), torch.tensor([[1, 1, 0, 1]])
    >>> float(aggregate(*merged, "seq-mean-token-mean", segments=torch.tensor([[1, 1, 0, 2]])))
    2.5
    """
    mask = mask.to(loss.dtype)
    if mode == "rollout-mean-token-mean":
        if weights is None:
            raise ValueError("loss aggregation 'rollout-mean-token-mean' needs the per-token weights")
        return (loss * mask * weights.to(loss.dtype)).sum()
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp(min=1.0)
    if mode not in ("seq-mean-token-mean", "seq-mean-token-sum-norm"):
        raise ValueError(f"unknown loss aggregation {mode!r}")
    if segments is None:
        per_seq_sum = (loss * mask).sum(dim=-1)
        per_seq_len = mask.sum(dim=-1)
    else:  # one "sequence" per (row, call)
        n_seg = int(segments.max()) + 1
        rows = torch.arange(loss.shape[0], device=loss.device)[:, None]
        keep = mask.bool() & (segments > 0)
        ids = (rows * n_seg + segments)[keep]
        per_seq_sum = torch.zeros(loss.shape[0] * n_seg, dtype=loss.dtype, device=loss.device)
        per_seq_sum = per_seq_sum.index_add(0, ids, (loss * mask)[keep])
        per_seq_len = torch.zeros_like(per_seq_sum).index_add(0, ids, mask[keep])
        present = per_seq_len > 0
        per_seq_sum, per_seq_len = per_seq_sum[present], per_seq_len[present]
    if mode == "seq-mean-token-mean":
        return (per_seq_sum / per_seq_len.clamp(min=1.0)).mean()
    return (per_seq_sum / float(max_tokens)).mean()
