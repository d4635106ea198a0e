"""What every policy-gradient algorithm shares: its knobs, their one validation, and how token losses
of a mini batch become one number.

:class:`~.grpo.GRPO` and :class:`~.ppo.PPO` subclass :class:`PolicyGradient`; each owns its advantages
(:meth:`PolicyGradient.advantages` per call before the update, :meth:`PolicyGradient.token_advantages`
per token inside it) and says whether it needs a value model (:attr:`PolicyGradient.needs_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal, get_args

import torch

from .batching import trained
from .trajectory import merge_trajectories

if TYPE_CHECKING:
    from .algorithm import StepContext
    from .batching import Sample, TokenBatch
    from .policies import Policy

__all__ = ["LOSS_AGGREGATIONS", "LossAggregation", "PolicyGradient", "micro_batch_weights"]

LossAggregation = Literal[
    "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "rollout-mean-token-mean"
]
LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)


@dataclass
class PolicyGradient:
    """The knobs GRPO and PPO share, validated once (see :class:`~.grpo.GRPO` for their meaning).

    ``loss_agg="rollout-mean-token-mean"`` weighs every rollout the same in each optimiser step,
    whatever its number of calls or tokens: a rollout's loss is the mean over all its trained tokens
    (every call), and the step's loss the mean over rollouts.
    """

    group_size: int = 4
    clip: float = 0.2
    clip_high: float | None = None
    kl_coef: float = 0.0
    kl_estimator: Literal["k1", "k3"] = "k3"
    lr: float = 1e-4  # LoRA: about 10x full fine-tuning's; chosen by benchmarks/learning_rg/lr_sweep.md
    weight_decay: float = 0.0
    epochs: int = 1
    mini_batch_size: int | None = None
    micro_batch_size: int = 8
    micro_batch_tokens: int = 2048
    max_grad_norm: float = 1.0
    loss_agg: LossAggregation = "token-mean"
    max_response_tokens: int = 512
    eps: float = 1e-6

    def __post_init__(self) -> None:
        name = type(self).__name__
        for knob in ("group_size", "epochs", "micro_batch_size", "micro_batch_tokens", "max_response_tokens"):
            value = getattr(self, knob)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: {knob} must be an integer >= 1, got {value!r}")
        if self.mini_batch_size is not None and self.mini_batch_size < 1:
            raise ValueError(f"{name}: mini_batch_size must be >= 1 or None, got {self.mini_batch_size!r}")
        if not 0 < self.clip < 1:
            raise ValueError(f"{name}: clip must be in (0, 1), got {self.clip}")
        if self.clip_high is not None and not self.clip_high > 0:
            raise ValueError(f"{name}: clip_high must be > 0 or None, got {self.clip_high}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise ValueError(
                f"{name}: unknown loss_agg {self.loss_agg!r}; one of {', '.join(LOSS_AGGREGATIONS)}"
            )
        if self.kl_estimator not in ("k1", "k3"):
            raise ValueError(f"{name}: unknown kl_estimator {self.kl_estimator!r}; one of k1, k3")
        if self.kl_coef < 0:
            raise ValueError(f"{name}: kl_coef must be >= 0, got {self.kl_coef}")
        if not self.lr >= 0:
            raise ValueError(f"{name}: lr must be >= 0, got {self.lr}")
        if self.weight_decay < 0 or not self.max_grad_norm > 0 or not self.eps > 0:
            raise ValueError(f"{name}: weight_decay must be >= 0, max_grad_norm and eps > 0")

    #: every rollout's calls are trained (the advantages weigh them)
    min_reward: ClassVar[float | None] = None

    # -- what each algorithm owns (see :mod:`.algorithm`) ----------------------------------------
    @property
    def updates_weights(self) -> bool:
        return True

    def rollout_engine(self) -> Any | None:
        """The policy plays itself."""
        return None

    @property
    def needs_reference(self) -> bool:
        """A KL term against the reference model (``kl_coef > 0``)."""
        return self.kl_coef > 0

    def update(self, ctx: StepContext, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        """Each call's advantage, then (unless no call has one) the clipped policy-gradient update."""
        stats: dict[str, float] = {}
        with ctx.timer.phase("advantages"):
            stats.update(self.advantages(samples))  # each call's advantage (GRPO: within its group)
        if stats.get("train/skipped_update"):
            return stats  # e.g. every GRPO group had zero spread: no gradient
        samples = trained(samples)  # masked ones counted in the baselines, left out of the loss
        if not samples:
            return {**stats, "train/skipped_update": 1.0}
        if ctx.merged:  # after the per-call advantages: each call keeps its own
            samples, merged = merge_trajectories(samples)
            stats.update(merged)
        result: dict[str, float] = {}
        ctx.train(policy, lambda model: result.update(ctx.optimise(samples, policy, model)))
        stats.update(result)
        return stats

    @property
    def needs_values(self) -> bool:
        """Whether the update trains a value head next to the policy (and reads its values)."""
        return False

    def value_head_lr(self) -> float:
        """Learning rate of the value head (when :attr:`needs_values`)."""
        return self.lr

    @property
    def value_coef(self) -> float:
        """Weight of the value loss in the token loss (0 without a value model)."""
        return 0.0

    def value_loss(
        self, values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor
    ) -> torch.Tensor:
        """Per-token value loss (before :attr:`value_coef`); only for algorithms that need values."""
        raise TypeError(f"{type(self).__name__} has no value model")

    def advantages(self, samples: list[Sample]) -> dict[str, float]:
        """Give every call its advantage before the update (``Sample.advantage``); returns stats.

        ``"train/skipped_update": 1.0`` in the stats: nothing to learn from these samples.
        The base class leaves the calls alone (advantages are per token, see :meth:`token_advantages`).
        """
        return {}

    def token_advantages(
        self,
        chunks: Sequence[Sequence[Sample]],
        batches: Sequence[TokenBatch],
        values: Sequence[torch.Tensor | None],
        merged: bool = False,
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Per-token advantages ``[B, R]`` of each micro batch, and the value targets (returns) when
        :attr:`needs_values`. The base class spreads each call's ``advantage`` over its tokens."""
        advs: list[torch.Tensor] = []
        for c, b in zip(chunks, batches, strict=True):
            tok_adv = torch.zeros(b.response_mask.shape)  # filled on the host, copied once
            for i, s in enumerate(c):  # each call's advantage on its response tokens
                tok_adv[i, : len(s.response_ids)] = torch.tensor(s.token_advantages())
            advs.append(tok_adv.to(b.response_mask.device) * b.response_mask)
        return advs, [None] * len(advs)

    def loss_weights(
        self, chunks: Sequence[Sequence[Sample]], masks: Sequence[torch.Tensor]
    ) -> list[tuple[float, torch.Tensor | None]]:
        """How the micro batches of one mini batch add up; see :func:`micro_batch_weights`."""
        return micro_batch_weights(self.loss_agg, chunks, masks)


def micro_batch_weights(
    mode: str, chunks: Sequence[Sequence[Sample]], masks: Sequence[torch.Tensor]
) -> list[tuple[float, torch.Tensor | None]]:
    """Per micro batch of one mini batch: its weight in the mini batch's loss and, for
    ``"rollout-mean-token-mean"``, the per-token weights to aggregate with (``None`` otherwise).

    ``sum_j weight_j * aggregate(loss_j, mask_j, mode, weights=w_j)`` is the loss of the whole mini
    batch as one batch. Token modes weigh a micro batch by its trained tokens, sequence modes by its
    calls; the rollout mode gives each rollout of the mini batch ``1 / rollouts`` of the loss, spread
    evenly over its trained tokens wherever they are (``rollout_id`` groups the calls; a sample
    without one is its own rollout).

    >>> import torch
    >>> from agentlightning_lite.rl.batching import Sample
    >>> a = [Sample([1], [2, 3, 4], None, 0.0, "g", rollout_id="a", index=i) for i in range(2)]
    >>> b = Sample([1], [2], None, 0.0, "g", rollout_id="b")
    >>> ws = micro_batch_weights("rollout-mean-token-mean", [a, [b]], [torch.ones(2, 3), torch.ones(1, 1)])
    >>> [round(w, 4) for w, _ in ws], round(float(ws[0][1][0, 0]), 4)  # a: 6 tokens, b: 1 token, half each
    ([0.5, 0.5], 0.1667)
    """
    if mode == "token-mean":
        n_tokens = sum(float(m.sum()) for m in masks)
        return [(float(m.sum()) / max(n_tokens, 1.0), None) for m in masks]
    if mode != "rollout-mean-token-mean":
        n_seqs = sum(s.num_segments for c in chunks for s in c)
        return [(sum(s.num_segments for s in c) / max(n_seqs, 1), None) for c in chunks]

    def key(s: Sample) -> object:
        return s.rollout_id or id(s)

    tokens: dict[object, float] = {}
    for c, m in zip(chunks, masks, strict=True):
        for i, s in enumerate(c):
            tokens[key(s)] = tokens.get(key(s), 0.0) + float(m[i].sum())
    n_rollouts = sum(1 for t in tokens.values() if t > 0)
    out: list[tuple[float, torch.Tensor | None]] = []
    for c, m in zip(chunks, masks, strict=True):
        w = torch.zeros(m.shape, dtype=torch.float64)
        for i, s in enumerate(c):
            t = tokens[key(s)]
            if t > 0:
                w[i] = m[i].to(torch.float64).cpu() / (n_rollouts * t)
        share = float(w.sum())
        # within the micro batch the weights sum to 1; its share of the mini batch is the weight
        out.append((share, (w / share if share > 0 else w).to(m.dtype).to(m.device)))
    return out
