"""The update of one policy on its samples, in three timed phases.

1. reference quantities, no gradient: the old logprobs (the engine's, checked against a
   recomputation, or recomputed), the reference model's logprobs (``algorithm.needs_reference``)
   and, for PPO, the old values (``timing/old_logprobs``, ``timing/ref_logprobs``);
2. advantages per token, the algorithm's own (``timing/advantages``);
3. the optimisation: epochs x mini-batches, gradient accumulation over micro-batches (``timing/update``),
   on the learner's primitives (:mod:`.primitives`: ``run_loss`` per micro-batch, ``optim_step``).

Each phase's seconds are added to the step's metrics under ``timing/...`` (summed over the policies
of a step), the way verl reports ``timing_s/...``.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .batching import Sample, TokenBatch, collate, forward_logprobs, micro_batches, packs
from .correction import correction_weights, mismatch_metrics
from .datum import AdamParams
from .distributed import partition_by_tokens
from .flops import update_flops
from .losses import aggregate, kl_penalty, policy_loss
from .policies import Policy, ValueHead
from .policy_gradient import PolicyGradient
from .primitives import LossBatch, LossFn, optim_step, run_loss
from .timing import Timer
from .weights import WeightHandOver

__all__ = ["Timer", "UpdateSettings", "micro_batches", "optimise", "train_policy", "update_policies"]

logger = logging.getLogger(__name__)


@dataclass
class UpdateSettings:
    """What the update needs beside the algorithm: where and how it computes."""

    device: torch.device
    autocast: Any = None
    pad_id: int = 0
    old_logprobs: str = "auto"
    logprob_tolerance: float = 1e-3
    #: the off-policy corrections (:mod:`.correction`); empty: none
    correction: tuple[Any, ...] = ()
    merged: bool = False  # samples are merged trajectories (one sequence per episode)
    share_prefix: bool = True  # a prefix shared by samples of a micro-batch runs once (.packing)
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
    engine_share: float  # the share of calls whose ratio is taken against the engine's logprobs
    mismatch_sum: float = 0.0  # over this rank's micro-batches (all of them in one process)
    mismatch_n: int = 0
    per_rank: bool = False  # each rank computed its own micro-batches' only (see _shares)
    #: per micro-batch, the correction's token weights (``None``: no correction there)
    weights: list[torch.Tensor | None] = field(default_factory=list)
    #: log(pi_old / pi_engine) of every trained token where both are known (for the mismatch metrics)
    log_rhos: list[torch.Tensor] = field(default_factory=list)
    masked_n: float = 0.0
    clipped_n: float = 0.0
    calls: int = 0  # calls whose engine logprobs were checked ("auto")
    fallbacks: int = 0  # ... and disagreed: their ratio is taken against the recomputation
    engine_calls: int = 0  # calls whose ratio is taken against the engine's logprobs
    #: on-policy (one optimizer step, no correction): no no-grad pass ran; ``old_lp[j]`` is ``None``
    #: and the gradient pass's own logprobs, detached, are the denominator (see :func:`on_policy`)
    from_gradient_pass: bool = False
    #: per micro-batch, the engine's logprobs kept to measure the mismatch in the gradient pass
    engine: list[torch.Tensor | None] = field(default_factory=list)


_warned_fallback = False


def _engine_logprobs(chunk: list[Sample], batch: TokenBatch, device: torch.device) -> torch.Tensor | None:
    """The engine's logprobs of a micro-batch as one tensor, or ``None`` when a sample lacks them."""
    engine_lps = [s.token_engine_logprobs() for s in chunk]
    if not all(lps is not None for lps in engine_lps):
        return None
    eng = torch.zeros(batch.response_mask.shape)  # filled on the host, copied once
    for i, lps in enumerate(engine_lps):
        eng[i, : len(lps)] = torch.tensor(lps)  # type: ignore[arg-type]
    return eng.to(device)


def on_policy(algo: PolicyGradient, n_chunks_per_step: list[list[int]], cfg: UpdateSettings) -> bool:
    """Whether the update is strictly on-policy: each sample gets exactly one optimizer step (one
    epoch, one mini-batch) and no off-policy correction is asked. Then ``pi_old`` is the weights the
    gradient pass runs with, so its own logprobs, detached, are the ratio's denominator (ratio exactly
    1, the gradient unchanged) and the no-grad pass that would recompute them is skipped, as TRL
    (``num_iterations == 1``) and verl do. ``old_logprobs="engine"`` keeps the engine's logprobs.

    >>> import agentlightning_lite as agl
    >>> cfg = UpdateSettings(device=torch.device("cpu"))
    >>> on_policy(agl.GRPO(group_size=2), [[0, 1]], cfg)
    True
    >>> on_policy(agl.GRPO(group_size=2, epochs=2), [[0, 1]], cfg)
    False
    >>> on_policy(agl.GRPO(group_size=2, mini_batch_size=2), [[0], [1]], cfg)
    False
    """
    return (
        algo.epochs == 1
        and len(n_chunks_per_step) == 1
        and not cfg.correction
        and cfg.old_logprobs != "engine"
    )


def _measure(out: _Reference, eng: torch.Tensor, lp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Add the engine/trainer mismatch of one micro-batch to ``out``; returns ``|eng - lp|`` on the mask."""
    diff = (eng - lp).abs() * mask
    out.mismatch_sum += float(diff.sum())
    out.mismatch_n += int(mask.sum())
    out.mismatch_max = max(out.mismatch_max, float(diff.max()))
    out.log_rhos.append((lp - eng)[mask > 0].cpu())
    return diff


def _check_calls(out: _Reference, diff: torch.Tensor, mask: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Per call, whether the engine's logprobs agree with the trainer's (mean |difference| within
    ``tolerance``); counted in ``out.calls`` / ``out.fallbacks``."""
    per_call = diff.sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    agree = per_call <= tolerance
    out.calls += int(agree.numel())
    out.fallbacks += int((~agree).sum())
    return agree


def _reference(
    model: Any,
    chunks: list[list[Sample]],
    batches: list[TokenBatch],
    algo: PolicyGradient,
    value_head: ValueHead | None,
    cfg: UpdateSettings,
    from_gradient_pass: bool = False,
) -> _Reference:
    """Phase 1, no gradient. The engine's logprobs are the behaviour policy's; a no-grad forward pass
    recomputes them with the weights the update starts from (``pi_old``), unless ``old_logprobs=
    "engine"`` without a correction. In "auto" mode every call is checked: it keeps the engine's
    logprobs when they agree with the recomputation within tolerance, else takes the recomputed ones.
    With a correction the ratio is always taken against ``pi_old`` and the correction weighs each token
    by ``pi_old / pi_engine``. With ``from_gradient_pass`` (:func:`on_policy`) no pass runs for the old
    logprobs (PPO's values still need one): ``old_lp`` holds ``None`` and the gradient pass supplies
    them, and measures the mismatch against the engine's."""
    model.eval()
    out = _Reference([], [], [], float("nan"), 0.0, 0.0, from_gradient_pass=from_gradient_pass)
    owned = _shares(chunks, batches, algo, cfg)
    out.per_rank = owned is not None
    corrected = bool(cfg.correction)
    with torch.no_grad():
        for i, (c, b) in enumerate(zip(chunks, batches, strict=True)):
            if owned is not None and i not in owned:  # another rank's: never read on this one
                out.old_lp.append(None)  # type: ignore[arg-type]
                out.old_v.append(None)
                out.weights.append(None)
                out.engine.append(None)
                if algo.needs_reference:
                    out.ref.append(None)  # type: ignore[arg-type]
                continue
            if from_gradient_pass:
                with cfg.timer.phase("old_logprobs"):
                    eng = _engine_logprobs(c, b, cfg.device)
                    v = None
                    if algo.needs_values:  # PPO's advantages need the old values before the loss
                        v = forward_logprobs(model, b, value_head, cfg.autocast)[1]
                out.old_lp.append(None)  # type: ignore[arg-type]
                out.old_v.append(v)
                out.weights.append(None)
                out.engine.append(eng)
            else:
                with cfg.timer.phase("old_logprobs"):
                    eng = _engine_logprobs(c, b, cfg.device)
                    trust = eng is not None and cfg.old_logprobs == "engine" and not corrected
                    lp = v = None
                    if not trust or algo.needs_values:
                        lp, v = forward_logprobs(model, b, value_head, cfg.autocast)
                    old, weight = lp, None
                    out.engine.append(None)
                    if eng is not None and lp is not None:
                        m = b.response_mask
                        diff = _measure(out, eng, lp, m)
                        if corrected:
                            weight, cstats = correction_weights(cfg.correction, lp, eng, m)
                            out.masked_n += cstats["masked_n"]
                            out.clipped_n += cstats["clipped_n"]
                        elif cfg.old_logprobs == "engine":
                            old = eng
                            out.engine_calls += len(c)
                        elif cfg.old_logprobs == "auto":  # per call: the engine's where they agree
                            agree = _check_calls(out, diff, m, cfg.logprob_tolerance)
                            old = torch.where(agree[:, None], eng, lp)
                            out.engine_calls += int(agree.sum())
                    elif trust:
                        old = eng
                        out.engine_calls += len(c)
                    out.old_lp.append(old)  # type: ignore[arg-type]
                    out.old_v.append(v)
                    out.weights.append(weight)
            if algo.needs_reference:
                with cfg.timer.phase("ref_logprobs"), model.disable_adapter():
                    out.ref.append(forward_logprobs(model, b, None, cfg.autocast)[0])
    n_calls = sum(len(c) for k, c in enumerate(chunks) if owned is None or k in owned)
    out.engine_share = out.engine_calls / n_calls if n_calls else 0.0
    if not from_gradient_pass:
        _summarise(out, cfg)
    return out


def _summarise(out: _Reference, cfg: UpdateSettings) -> None:
    """The mean mismatch, and a warning (once; later steps log it) when calls disagree."""
    global _warned_fallback
    out.mismatch_mean = out.mismatch_sum / out.mismatch_n if out.mismatch_n else float("nan")
    if out.fallbacks:
        log = logger.info if _warned_fallback else logger.warning
        _warned_fallback = True
        how = (
            "their ratio is taken against the recomputation"
            if not out.from_gradient_pass
            else "measured in the gradient pass (the update is on-policy: the ratio is taken against it)"
        )
        log(
            "step %d: the engine's logprobs of %d of %d calls disagree with the trainer's recomputation "
            "(mean |difference| > %g): %s",
            cfg.step,
            out.fallbacks,
            out.calls,
            cfg.logprob_tolerance,
            how,
        )


def _groups(chunks: list[list[Sample]], algo: PolicyGradient) -> list[list[int]]:
    """The micro-batches of each mini-batch, by index (every epoch goes through the same ones)."""
    mini = algo.mini_batch_size or sum(len(c) for c in chunks)
    per_mini = max(1, math.ceil(mini / algo.micro_batch_size))
    order = list(range(len(chunks)))
    return [order[start : start + per_mini] for start in range(0, len(order), per_mini)]


def _shares(
    chunks: list[list[Sample]], batches: list[TokenBatch], algo: PolicyGradient, cfg: UpdateSettings
) -> set[int] | None:
    """Under a data-parallel update: the micro-batches this rank computes the loss of (so it needs
    their old and reference logprobs; "auto" checks each call on the rank that owns it). ``None``: this
    rank needs them all (one process; PPO, whose advantages need every old value; sharded layers,
    whose forward passes every rank must run)."""
    dp = cfg.data_parallel
    if dp is None or algo.needs_values or dp.lockstep is not None:
        return None
    owned: set[int] = set()
    for group in _groups(chunks, algo):
        split = partition_by_tokens([batches[j].input_ids.numel() for j in group], dp.world_size)
        owned.update(group[k] for k in split[dp.rank])
    return owned


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
    """Phase 3: epochs x mini-batches; each micro-batch's loss through :func:`~.primitives.run_loss`
    (gradients accumulate), one :func:`~.primitives.optim_step` per mini-batch."""
    advs, rets = advantages
    old_lp, ref, old_v = reference.old_lp, reference.ref, reference.old_v
    model.train()
    if value_head is not None:
        value_head.train()
    clip_high = algo.clip_high if algo.clip_high is not None else algo.clip
    adam = AdamParams.from_optimizer(optimizer, grad_clip_norm=algo.max_grad_norm)
    logs: dict[str, list[float]] = {}

    def token_loss(j: int, weight: float, tok_w: torch.Tensor | None) -> LossFn:
        """Micro-batch ``j``'s loss: the clipped surrogate (corrected), KL and value terms, aggregated
        as ``loss_agg`` says and weighed by its share of the mini-batch."""
        b = batches[j]
        segs = b.segment_ids if cfg.merged else None

        def loss_fn(lb: LossBatch) -> torch.Tensor:
            lp, v = lb.logprobs, lb.values
            old = old_lp[j]
            if reference.from_gradient_pass:  # on-policy: pi_old is this pass's own logprobs (ratio 1)
                old = lp.detach()
                if (eng := reference.engine[j]) is not None:
                    diff = _measure(reference, eng, old, b.response_mask)
                    if cfg.old_logprobs == "auto":
                        _check_calls(reference, diff, b.response_mask, cfg.logprob_tolerance)
            pg, pstats = policy_loss(lp, old, advs[j], b.response_mask, algo.clip, clip_high)
            if (is_w := reference.weights[j]) is not None:
                pg = pg * is_w  # the off-policy correction: loss_t * w_t (TIS / masked IS, no gradient)
            tok_loss = pg
            if algo.needs_reference:
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
            logs.setdefault("train/pg_loss", []).append(float(aggregate(pg.detach(), b.response_mask, *agg)))
            logs.setdefault("train/clip_frac", []).append(float(pstats["clip_frac"]))
            return aggregate(tok_loss, b.response_mask, *agg) * weight

        return loss_fn

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
                loss, _, _ = run_loss(
                    model, batches[j], token_loss(j, weight, tok_w), value_head=value_head,
                    autocast=cfg.autocast, label=f"loss at step {cfg.step}",
                )  # fmt: skip
                logs.setdefault("train/loss", []).append(loss / max(weight, 1e-12))
            step = optim_step(optimizer, adam, value_head=value_head, data_parallel=dp)
            logs.setdefault("train/grad_norm", []).append(step["grad_norm"])
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
    share = cfg.share_prefix and packs(model)
    chunks = micro_batches(samples, algo.micro_batch_size, algo.micro_batch_tokens, share)
    batches = [collate(c, cfg.pad_id, share).to(cfg.device) for c in chunks]
    skip = on_policy(algo, _groups(chunks, algo), cfg)
    reference = _reference(model, chunks, batches, algo, value_head, cfg, from_gradient_pass=skip)
    with cfg.timer.phase("advantages"):  # GRPO: each call's; PPO: GAE on the old values
        advantages = algo.token_advantages(chunks, batches, reference.old_v, cfg.merged)
    t_update = time.perf_counter()
    with cfg.timer.phase("update"):
        logs = _epochs(model, chunks, batches, reference, advantages, algo, optimizer, value_head, cfg)
    t_update = time.perf_counter() - t_update
    if skip:
        _summarise(reference, cfg)
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
    out["train/ratio_from_engine_logprobs"] = reference.engine_share
    if cfg.old_logprobs == "auto" and not cfg.correction:
        out["train/old_logprobs_fallback"] = reference.fallbacks / reference.calls if reference.calls else 0.0
    out["train/old_logprobs_pass"] = 0.0 if skip else 1.0
    out.update(mismatch_metrics(reference.log_rhos))
    if cfg.correction:
        n_tok = sum(int(x.numel()) for x in reference.log_rhos)
        masked, clipped = reference.masked_n, reference.clipped_n
        if (dp := cfg.data_parallel) is not None and reference.per_rank:
            masked, clipped, n_tok = dp.sum_across([masked, clipped, float(n_tok)])
        out["mismatch/masked_frac"] = masked / n_tok if n_tok else 0.0
        out["mismatch/clipped_frac"] = clipped / n_tok if n_tok else 0.0
    out["train/response_tokens"] = float(sum(sum(s.token_mask()) for s in samples))
    out["train/sequences"] = float(len(samples))
    out["train/sequence_tokens"] = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
    out.update(_cost(model, batches, algo, skip, t_update))
    if cfg.data_parallel:
        out.update(cfg.data_parallel.metrics())
    return out


def _cost(
    model: Any, batches: list[TokenBatch], algo: PolicyGradient, skip: bool, seconds: float
) -> dict[str, float]:
    """What the update computed: tokens through the gradient passes (after prefix sharing) and
    through the no-grad passes, its model FLOPs (:mod:`.flops`) and the FLOP/s it achieved (this
    rank's micro-batches under data parallelism are not told apart: the figures are the step's)."""
    tokens = sum(b.model_tokens for b in batches)
    scored = sum(int((b.response_mask > 0).sum()) for b in batches)
    flops = update_flops(model).forward_backward(tokens, scored) * algo.epochs
    no_grad = 0 if skip and not algo.needs_values else tokens
    if algo.needs_reference:
        no_grad += tokens
    return {
        "perf/update_tokens": float(tokens * algo.epochs),
        "perf/plain_tokens": float(sum(int(b.attention_mask.sum()) for b in batches) * algo.epochs),
        "perf/no_grad_tokens": float(no_grad),
        "perf/update_flops": float(flops),
        "perf/update_flops_per_s": flops / seconds if seconds > 0 else 0.0,
    }


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
