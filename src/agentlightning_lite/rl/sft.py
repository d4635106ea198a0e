"""SFT: supervised fine-tuning of the LoRA policy on recorded calls (teacher forcing, response tokens only).

The same traces that feed RL feed a supervised warm start: every recorded policy call carries the exact
prompt and response token ids the server saw, so the loss is the cross-entropy of the response tokens
given the prompt, nothing re-tokenised. The calls come from rollouts that the trainer runs, either
against the policy itself (keep the good ones: rejection-sampling fine-tuning, ``min_reward``) or
against a ``teacher`` engine (e.g. an ``agl.engines.ScriptedEngine`` that replies with worked
solutions), through the same agent code, adapters and server: the format learned is the one the agent
sends.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from .batching import Sample, collate, forward_logprobs, micro_batches, trained
from .datum import AdamParams
from .distributed import DataParallel
from .primitives import optim_step, run_loss
from .trajectory import merge_trajectories

if TYPE_CHECKING:
    from .algorithm import StepContext
    from .policies import Policy

__all__ = ["SFT", "sft_loss", "sft_update"]


@dataclass
class SFT:
    """Every supervised fine-tuning knob in one place; pass it where GRPO or PPO goes.

    Each training step takes ``batch_size`` tasks, runs the agent ``group_size`` times on each
    (against ``teacher`` when given, else the policy), keeps the calls of rollouts whose reward is at
    least ``min_reward`` and minimises the mean negative log-likelihood of their response tokens.

    Args:
        teacher: an engine that plays the policy during these rollouts (an
            ``agl.engines.ScriptedEngine`` replying with worked solutions, or another model's
            engine); it must tokenise with the policy's tokenizer so that the recorded token ids
            are the policy's. With remote runners (``Trainer(runners=...)``) the trainer's server
            serves it while the step's rollouts run (its other rollouts wait meanwhile).
            ``None``: the policy itself (rejection-sampling fine-tuning).
        min_reward: calls of rollouts with a lower final reward (or none) are not trained on;
            ``None`` keeps every call.
        group_size: rollouts per task (more than 1 only makes sense when sampling the policy).
        lr: AdamW learning rate of the adapter.
        weight_decay: AdamW weight decay.
        epochs: passes over each step's calls.
        micro_batch_size: most samples per forward/backward (gradients accumulate over a mini batch).
        micro_batch_tokens: most padded tokens per forward/backward: bounds the activation memory
            (about 2 GiB per 1000 tokens for SmolLM2-135M in float32).
        mini_batch_size: samples per optimiser step (``None``: one optimiser step per epoch).
        max_grad_norm: gradient clipping by global norm.
        kl_coef: always 0 (no reference model is needed); present so SFT reads like GRPO/PPO.

    >>> import agentlightning_lite as agl
    >>> agl.SFT(lr=1e-4, epochs=2, min_reward=1.0).epochs
    2
    >>> trainer = agl.Trainer(model="smollm2-135m", algorithm=agl.SFT(teacher=engine))  # doctest: +SKIP
    >>> trainer.fit(agent, tasks)  # teacher rollouts, then the policy learns them  # doctest: +SKIP
    >>> trainer.fit(agent, tasks, steps=trainer.step + 8, algorithm=agl.GRPO())  # then RL  # doctest: +SKIP
    """

    teacher: Any = None
    min_reward: float | None = None
    group_size: int = 1
    lr: float = 1e-4
    weight_decay: float = 0.0
    epochs: int = 1
    micro_batch_size: int = 4
    micro_batch_tokens: int = 2048
    mini_batch_size: int | None = None
    max_grad_norm: float = 1.0
    kl_coef: float = 0.0

    def __post_init__(self) -> None:
        if self.group_size < 1 or self.epochs < 1 or self.micro_batch_size < 1:
            raise ValueError("group_size, epochs and micro_batch_size must be >= 1")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if self.kl_coef != 0.0:
            raise ValueError("SFT has no KL term: kl_coef must be 0")

    # -- what the training step asks (see :mod:`.algorithm`) ------------------------------------
    @property
    def updates_weights(self) -> bool:
        return True

    def rollout_engine(self) -> Any | None:
        """The teacher plays the policy when there is one (its calls are recorded alike)."""
        return self.teacher

    @property
    def needs_values(self) -> bool:
        return False

    @property
    def needs_reference(self) -> bool:
        return False

    def value_head_lr(self) -> float:
        return self.lr

    def update(self, ctx: StepContext, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        """Teacher-forced epochs on the calls (:func:`sft_update`), seeded by the run's seed and step."""
        stats: dict[str, float] = {}
        samples = trained(samples)  # replies cut at max_tokens under SampleConfig(truncated="mask")
        if not samples:
            return {"train/skipped_update": 1.0}
        if ctx.merged:
            samples, stats = merge_trajectories(samples)
        seed = ctx.seed * 1_000_003 + ctx.step
        ctx.train(
            policy,
            lambda model: stats.update(
                sft_update(model, policy.optimizer, samples, self, ctx.pad_id, seed, ctx.autocast)
            ),
        )
        return stats


def _greedy(samples: Sequence[Sample]) -> list[Sample]:
    """Sampling temperature does not apply to teacher forcing: score every token at T=1."""
    out = []
    for s in samples:
        parts = [_greedy([p])[0] for p in s.parts] if s.parts else None
        out.append(
            Sample(
                s.prompt_ids, s.response_ids, None, s.reward, s.group, 1.0, 0.0, s.rollout_id, s.index,
                s.agent, s.meta, parts, s.offsets,
            )
        )  # fmt: skip
    return out


def sft_loss(
    model: Any,
    samples: Sequence[Sample],
    pad_id: int = 0,
    micro_batch_size: int = 8,
    micro_batch_tokens: int = 4096,
) -> float:
    """Mean negative log-likelihood per response token of ``samples`` under ``model`` (no gradient).

    >>> sft_loss(model, samples)  # doctest: +SKIP
    1.37
    """
    samples = _greedy(samples)
    device = next(model.parameters()).device
    total, n = 0.0, 0.0
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for c in micro_batches(samples, micro_batch_size, micro_batch_tokens):
            b = collate(c, pad_id).to(device)
            lp, _ = forward_logprobs(model, b)
            total += float(-(lp * b.response_mask).sum())
            n += float(b.response_mask.sum())
    model.train(was_training)
    return total / n if n else float("nan")


def sft_update(
    model: Any,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[Sample],
    algo: SFT,
    pad_id: int = 0,
    seed: int = 0,
    autocast: torch.dtype | None = None,
    data_parallel: DataParallel | None = None,
) -> dict[str, float]:
    """Teacher-forced updates of ``model`` on ``samples``: ``algo.epochs`` passes, token-mean NLL.

    The loss of a mini batch is ``-sum(log p(response token | prompt, earlier tokens)) / tokens``
    over the response tokens only (prompt, tool outputs and padding are masked out): the learner's
    ``cross_entropy`` with weight ``1 / tokens`` on each, one ``optim_step`` per mini batch. Returns the
    mean loss, the gradient norm and the token count.

    Under ``torchrun`` / ``accelerate launch`` (``data_parallel``, default: this process's active
    :class:`~.distributed.DataParallel`) every rank shuffles and batches the same samples, computes
    only its share of each mini batch's micro-batches (split by padded tokens), and the gradients
    are summed across ranks before the clip and the step: each rank takes the step one process takes.

    >>> sft_update(model, optimizer, samples, agl.SFT(lr=1e-4), pad_id=0)  # doctest: +SKIP
    {'train/loss': 1.9, 'train/grad_norm': 0.7, 'sft/updates': 1.0, ...}
    """
    dp = data_parallel if data_parallel is not None else DataParallel.active()
    samples = _greedy(samples)
    device = next(model.parameters()).device
    adam = AdamParams.from_optimizer(optimizer, grad_clip_norm=algo.max_grad_norm)
    rng = random.Random(seed)
    logs: dict[str, list[float]] = {}
    model.train()
    optimizer.zero_grad(set_to_none=True)
    for _epoch in range(algo.epochs):
        order = list(samples)
        rng.shuffle(order)
        mini = algo.mini_batch_size or len(order)
        for start in range(0, len(order), mini):
            chunks = micro_batches(
                order[start : start + mini], algo.micro_batch_size, algo.micro_batch_tokens
            )
            batches = [collate(c, pad_id).to(device) for c in chunks]
            n_tokens = sum(float(b.response_mask.sum()) for b in batches)
            if n_tokens == 0:
                continue
            total = 0.0
            mine = dp.mine([b.input_ids.numel() for b in batches]) if dp else range(len(batches))
            for k, b in enumerate(batches):
                if k not in mine:
                    continue  # another rank's share of the mini batch
                # the mini batch's token-mean NLL: cross-entropy, each trained token weighing 1 / tokens
                loss, _, _ = run_loss(
                    model, b, "cross_entropy", {"weights": b.response_mask / n_tokens},
                    autocast=autocast, label="SFT loss",
                )  # fmt: skip
                total += loss
            step = optim_step(optimizer, adam, data_parallel=dp)
            logs.setdefault("train/loss", []).append(total)
            logs.setdefault("train/grad_norm", []).append(step["grad_norm"])
    model.eval()
    if dp and logs:  # each rank's loss is its share of every mini batch's: sum them
        logs["train/loss"] = dp.sum_across(logs["train/loss"])
    out = {k: statistics.fmean(v) for k, v in logs.items() if v}
    out["sft/updates"] = float(len(logs.get("train/loss", [])))
    out["train/response_tokens"] = float(sum(sum(s.token_mask()) for s in samples))
    out["train/sequences"] = float(len(samples))
    out["sft/perplexity"] = math.exp(min(out.get("train/loss", float("nan")), 50.0))
    if dp:
        out.update(dp.metrics())
    return out
