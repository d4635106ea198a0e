"""GRPO: group-relative advantages (the clipped policy-gradient loss it minimises is in :mod:`.losses`).

LightningRL is hierarchical: credit assignment (``agl.credit``) first gives every policy call of an
episode a reward; then each call's response is a single-turn RL sample. GRPO (Shao et al. 2024,
DeepSeekMath) needs no value model: the advantage of a sample is its reward relative to the other
samples of the same task (the group of ``group_size`` rollouts of one task, all their calls).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .advantages import group_advantages
from .losses import aggregate, kl_penalty, policy_loss
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
