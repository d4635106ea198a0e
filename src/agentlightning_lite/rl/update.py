"""The update of one policy on its samples, in three timed phases.

1. reference quantities, no gradient: the old logprobs (the engine's, checked against a
   recomputation, or recomputed), the reference model's logprobs (``kl_coef > 0``) and, for PPO, the
   old values (``timing/old_logprobs``, ``timing/ref_logprobs``);
2. advantages per token, the algorithm's own (``timing/advantages``);
3. the optimisation: epochs x mini-batches, gradient accumulation over micro-batches (``timing/update``).

Each phase's seconds are added to the step's metrics under ``timing/...`` (summed over the policies
of a step), the way verl reports ``timing_s/...``.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .batching import Sample, TokenBatch, collate, forward_logprobs, micro_batches
from .distributed import partition_by_tokens
from .grpo import aggregate, kl_penalty, policy_loss
from .policies import Policy
from .policy_gradient import PolicyGradient
from .ppo import ValueHead
from .timing import Timer
from .weights import WeightHandOver

__all__ = ["Timer", "UpdateSettings", "micro_batches", "optimise", "train_policy", "update_policies"]


@dataclass
class UpdateSettings:
    """What the update needs beside the algorithm: where and how it computes."""

    device: torch.device
    autocast: Any = None
    pad_id: int = 0
    old_logprobs: str = "auto"
    logprob_tolerance: float = 1e-3
    merged: bool = False  # samples are merged trajectories (one sequence per episode)
    step: int = 0
    timer: Timer = field(default_factory=Timer)
    #: a :class:`~.distributed.DataParallel` when several ranks share the update, else ``None``
    data_parallel: Any = None


@dataclass
class _Reference:
    old_lp: list[torch.Tensor]
    ref: list[torch.Tensor]
    old_v: list[torch.Tensor | None]
    mismatch_mean: float
    mismatch_max: float
    used_engine: bool
    mismatch_sum: float = 0.0  # over this rank's micro-batches (all of them in one process)
    mismatch_n: int = 0
    per_rank: bool = False  # each rank computed its own micro-batches' only (see _shares)


def _engine_logprobs(chunk: list[Sample], batch: TokenBatch, device: torch.device) -> torch.Tensor | None:
    """The engine's logprobs of a micro-batch as one tensor, or ``None`` when a sample lacks them."""
    engine_lps = [s.token_engine_logprobs() for s in chunk]
    if not all(lps is not None for lps in engine_lps):
        return None
    eng = torch.zeros(batch.response_mask.shape)  # filled on the host, copied once
    for i, lps in enumerate(engine_lps):
        eng[i, : len(lps)] = torch.tensor(lps)  # type: ignore[arg-type]
    return eng.to(device)


def _reference(
    model: Any,
    chunks: list[list[Sample]],
    batches: list[TokenBatch],
    algo: PolicyGradient,
    value_head: ValueHead | None,
    cfg: UpdateSettings,
) -> _Reference:
    """Phase 1, no gradient. The engine's logprobs are the behaviour policy's; a no-grad forward pass
    checks them. In "auto" mode, once the first micro-batch agrees within tolerance the rest are not
    recomputed (same weights, same numerics), which saves a forward pass per sample."""
    model.eval()
    out = _Reference([], [], [], float("nan"), 0.0, False)
    agree: bool | None = None  # unknown until a micro-batch has been checked
    owned, decides = _shares(chunks, batches, algo, cfg)
    out.per_rank = owned is not None
    with torch.no_grad():
        for i, (c, b) in enumerate(zip(chunks, batches, strict=True)):
            mine = owned is None or i in owned
            if not mine and i != decides:  # another rank's: never read on this one
                out.old_lp.append(None)  # type: ignore[arg-type]
                out.old_v.append(None)
                if algo.kl_coef > 0:
                    out.ref.append(None)  # type: ignore[arg-type]
                continue
            with cfg.timer.phase("old_logprobs"):
                eng = _engine_logprobs(c, b, cfg.device)
                trust = eng is not None and (cfg.old_logprobs == "engine" or agree is True)
                lp = v = None
                if not trust or algo.needs_values:
                    lp, v = forward_logprobs(model, b, value_head, cfg.autocast)
                if eng is not None and lp is not None:
                    diff = (eng - lp).abs() * b.response_mask
                    chunk_sum, chunk_n = float(diff.sum()), int(b.response_mask.sum())
                    if cfg.old_logprobs == "auto" and agree is None:
                        agree = chunk_sum / max(chunk_n, 1) <= cfg.logprob_tolerance
                    if mine:  # each micro-batch counted once across ranks
                        out.mismatch_sum += chunk_sum
                        out.mismatch_n += chunk_n
                        out.mismatch_max = max(out.mismatch_max, float(diff.max()))
                use_eng = eng is not None and (cfg.old_logprobs == "engine" or agree is True)
                out.old_lp.append(eng if use_eng else lp)  # type: ignore[arg-type]
                out.old_v.append(v)
            if algo.kl_coef > 0:
                if mine:
                    with cfg.timer.phase("ref_logprobs"), model.disable_adapter():
                        out.ref.append(forward_logprobs(model, b, None, cfg.autocast)[0])
                else:
                    out.ref.append(None)  # type: ignore[arg-type]
    out.mismatch_mean = out.mismatch_sum / out.mismatch_n if out.mismatch_n else float("nan")
    out.used_engine = cfg.old_logprobs == "engine" or agree is True
    return out


def _groups(chunks: list[list[Sample]], algo: PolicyGradient) -> list[list[int]]:
    """The micro-batches of each mini-batch, by index (every epoch goes through the same ones)."""
    mini = algo.mini_batch_size or sum(len(c) for c in chunks)
    per_mini = max(1, math.ceil(mini / algo.micro_batch_size))
    order = list(range(len(chunks)))
    return [order[start : start + per_mini] for start in range(0, len(order), per_mini)]


def _shares(
    chunks: list[list[Sample]], batches: list[TokenBatch], algo: PolicyGradient, cfg: UpdateSettings
) -> tuple[set[int] | None, int | None]:
    """Under a data-parallel update: the micro-batches this rank computes the loss of (so it needs
    their old and reference logprobs), and the one where ``old_logprobs="auto"`` compares the engine's
    logprobs with its own (the first that has them all: every rank checks that one, so they all decide
    alike). ``(None, None)``: this rank needs them all (one process; PPO, whose advantages need every
    old value; sharded layers, whose forward passes every rank must run)."""
    dp = cfg.data_parallel
    if dp is None or algo.needs_values or dp.lockstep is not None:
        return None, None
    owned: set[int] = set()
    for group in _groups(chunks, algo):
        split = partition_by_tokens([batches[j].input_ids.numel() for j in group], dp.world_size)
        owned.update(group[k] for k in split[dp.rank])
    decides = None
    if cfg.old_logprobs == "auto":
        has_engine = (all(s.token_engine_logprobs() is not None for s in c) for c in chunks)
        decides = next((i for i, ok in enumerate(has_engine) if ok), None)
    return owned, decides


def _epochs(
    model: Any,
    chunks: list[list[Sample]],
    batches: list[TokenBatch],
    reference: _Reference,
    advantages: tuple[list[torch.Tensor], list[Any]],
    algo: PolicyGradient,
    optimizer: torch.optim.Optimizer,
    value_head: ValueHead | None,
    cfg: UpdateSettings,
) -> dict[str, list[float]]:
    """Phase 3: epochs x mini-batches, gradient accumulation over micro-batches."""
    advs, rets = advantages
    old_lp, ref, old_v = reference.old_lp, reference.ref, reference.old_v
    model.train()
    if value_head is not None:
        value_head.train()
    clip_high = algo.clip_high if algo.clip_high is not None else algo.clip
    params = [p for g in optimizer.param_groups for p in g["params"]]
    logs: dict[str, list[float]] = {}
    for _epoch in range(algo.epochs):
        for group in _groups(chunks, algo):
            # each micro batch weighs its share of the mini batch, as one big batch would
            masks = [batches[j].response_mask for j in group]
            weights = algo.loss_weights([chunks[j] for j in group], masks)
            optimizer.zero_grad(set_to_none=True)
            dp = cfg.data_parallel  # several ranks: this one computes its share of the mini batch
            mine = dp.mine([batches[j].input_ids.numel() for j in group]) if dp else range(len(group))
            for k, (j, (weight, tok_w)) in enumerate(zip(group, weights, strict=True)):
                if k not in mine:
                    continue
                b = batches[j]
                segs = b.segment_ids if cfg.merged else None
                lp, v = forward_logprobs(model, b, value_head, cfg.autocast)
                pg, pstats = policy_loss(lp, old_lp[j], advs[j], b.response_mask, algo.clip, clip_high)
                tok_loss = pg
                if algo.kl_coef > 0:
                    kl = kl_penalty(lp, ref[j], algo.kl_estimator)
                    tok_loss = tok_loss + algo.kl_coef * kl
                    logs.setdefault("train/kl", []).append(
                        float((kl.detach() * b.response_mask).sum() / b.response_mask.sum())
                    )
                if algo.needs_values:
                    vl = algo.value_loss(v, old_v[j], rets[j])  # type: ignore[arg-type]
                    tok_loss = tok_loss + algo.value_coef * vl
                    logs.setdefault("ppo/value_loss", []).append(
                        float((vl.detach() * b.response_mask).sum() / b.response_mask.sum())
                    )
                agg = (algo.loss_agg, algo.max_response_tokens, segs, tok_w)
                loss = aggregate(tok_loss, b.response_mask, *agg) * weight
                if not torch.isfinite(loss):
                    raise FloatingPointError(f"non-finite loss at step {cfg.step}: {float(loss)}")
                loss.backward()
                logs.setdefault("train/loss", []).append(float(loss.detach()) / max(weight, 1e-12))
                pg_loss = float(aggregate(pg.detach(), b.response_mask, *agg))
                logs.setdefault("train/pg_loss", []).append(pg_loss)
                logs.setdefault("train/clip_frac", []).append(float(pstats["clip_frac"]))
            if dp:
                dp.all_reduce_grads(params)  # the sum is the whole mini batch's gradient
            grad_norm = torch.nn.utils.clip_grad_norm_(params, algo.max_grad_norm)
            logs.setdefault("train/grad_norm", []).append(float(grad_norm))
            optimizer.step()
    model.eval()
    return logs


def optimise(
    model: Any,
    samples: list[Sample],
    algo: PolicyGradient,
    optimizer: torch.optim.Optimizer,
    value_head: ValueHead | None,
    cfg: UpdateSettings,
) -> dict[str, float]:
    """Update ``model`` (its active adapter) on ``samples``, whose advantages are already set; returns
    the update's metrics (``train/loss``, ``train/grad_norm``, ``train/logprob_mismatch_mean``...)."""
    chunks = micro_batches(samples, algo.micro_batch_size, algo.micro_batch_tokens)
    batches = [collate(c, cfg.pad_id).to(cfg.device) for c in chunks]
    reference = _reference(model, chunks, batches, algo, value_head, cfg)
    with cfg.timer.phase("advantages"):  # GRPO: each call's; PPO: GAE on the old values
        advantages = algo.token_advantages(chunks, batches, reference.old_v, cfg.merged)
    with cfg.timer.phase("update"):
        logs = _epochs(model, chunks, batches, reference, advantages, algo, optimizer, value_head, cfg)
    mismatch_mean, mismatch_max = reference.mismatch_mean, reference.mismatch_max
    if (dp := cfg.data_parallel) is not None:  # every rank's micro-batches in the metrics, as in one process
        logs = dp.gather_logs(logs)
        if reference.per_rank:  # each rank checked its own
            maxes = [0.0] * dp.world_size
            maxes[dp.rank] = reference.mismatch_max
            total, n, *each = dp.sum_across([reference.mismatch_sum, reference.mismatch_n, *maxes])
            mismatch_mean, mismatch_max = (total / n if n else float("nan")), max(each)
    out = {k: statistics.fmean(v) for k, v in logs.items()}
    out["train/logprob_mismatch_mean"] = mismatch_mean
    out["train/logprob_mismatch_max"] = mismatch_max
    out["train/ratio_from_engine_logprobs"] = 1.0 if reference.used_engine else 0.0
    out["train/response_tokens"] = float(sum(sum(s.token_mask()) for s in samples))
    out["train/sequences"] = float(len(samples))
    out["train/sequence_tokens"] = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
    if cfg.data_parallel:
        out.update(cfg.data_parallel.metrics())
    return out


def update_policies(
    policies: Sequence[Policy],
    samples: list[Sample],
    update_one: Callable[[Policy, list[Sample]], dict[str, float]],
) -> dict[str, float]:
    """Update every policy on its own agents' samples (``update_one``: its advantages, gradient, step).

    With one adapter per agent each policy's metrics go under ``<policy>/``, and the mean loss, grad
    norm and pg loss (and the total of response tokens) of those that trained at the top level."""
    stats: dict[str, float] = {}
    skipped = 0
    for pol in policies:
        mine = [s for s in samples if s.meta.get("policy") == pol.name]
        st = update_one(pol, mine) if mine else {"train/skipped_update": 1.0}
        skipped += int(st.get("train/skipped_update", 0.0) == 1.0)
        stats.update({f"{_prefix(pol)}{k}": v for k, v in st.items()})
        stats[f"{_prefix(pol)}train/samples"] = float(len(mine))
    for key in ("train/loss", "train/grad_norm", "train/pg_loss", "train/response_tokens"):
        vals = [stats[f"{_prefix(p)}{key}"] for p in policies if f"{_prefix(p)}{key}" in stats]
        if vals:
            stats[key] = sum(vals) if key == "train/response_tokens" else statistics.fmean(vals)
    if skipped == len(policies):
        stats["train/skipped_update"] = 1.0
    return stats


def _prefix(policy: Policy) -> str:
    """Where a policy's metrics go: ``<agent>/...`` with one adapter per agent, else the top level."""
    return "" if policy.adapter is None else f"{policy.name}/"


def train_policy(
    policy: Policy, weights: WeightHandOver, timer: Timer, update: Callable[[Any], None]
) -> None:
    """Run ``update(model)`` with ``policy``'s adapter active and hand the result to the engine
    (``timing/weights``: the hand-over's share of the time)."""
    inside = 0.0

    def step(model: Any) -> None:
        nonlocal inside
        t = time.perf_counter()
        if policy.adapter is not None and model.active_adapter != policy.adapter:
            model.set_adapter(policy.adapter)  # the one adapter that learns (and gets gradients)
        update(model)
        inside += time.perf_counter() - t

    t0 = time.perf_counter()
    weights.apply(step, [policy.adapter])
    timer.add("weights", time.perf_counter() - t0 - inside)
