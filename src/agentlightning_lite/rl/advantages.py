"""GRPO's group-relative advantages, in plain Python: the trainer's and the web view's one definition."""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence

__all__ = ["group_advantages"]


def group_advantages(
    rewards: Sequence[float],
    groups: Sequence[Hashable],
    scale: bool | str = True,
    eps: float = 1e-6,
) -> tuple[list[float], dict[str, float]]:
    """GRPO advantages: ``A_i = (r_i - mean(r_g)) / (std(r_g) + eps)`` over the samples of group ``g``.

    ``scale``: ``True`` or ``"group"`` divides by the group's std (GRPO), ``"batch"`` by the std of all
    the rewards (TRL's ``scale_rewards="batch"``), ``False`` or ``"none"`` only subtracts the group's mean
    (Dr. GRPO). Returns the advantages and stats: how many groups had zero spread (they give no gradient).

    >>> adv, stats = group_advantages([1.0, 0.0, 1.0, 1.0], ["a", "a", "b", "b"])
    >>> [round(a, 3) for a in adv], stats["zero_std_groups"]
    ([0.707, -0.707, 0.0, 0.0], 1.0)
    """
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(groups):
        by_group.setdefault(g, []).append(i)
    mode = {True: "group", False: "none"}.get(scale, scale) if isinstance(scale, bool) else scale
    if mode not in ("group", "batch", "none"):
        raise ValueError(f"scale_rewards must be 'group', 'batch', 'none' or a bool, got {scale!r}")
    batch_std = statistics.stdev([float(r) for r in rewards]) if len(rewards) > 1 else 0.0
    adv = [0.0] * len(rewards)
    zero = 0
    for idx in by_group.values():
        r = [float(rewards[i]) for i in idx]
        mean = statistics.fmean(r)
        std = statistics.stdev(r) if len(idx) > 1 else 0.0  # the sample (unbiased) std, as TRL and verl
        if std < 1e-8:
            zero += 1  # all samples alike: nothing to prefer, no gradient
            continue
        for i, v in zip(idx, r, strict=True):
            div = {"group": std + eps, "batch": batch_std + eps, "none": 1.0}[mode]
            adv[i] = (v - mean) / div
    n = max(len(by_group), 1)
    return adv, {"groups": float(len(by_group)), "zero_std_groups": float(zero), "zero_std_frac": zero / n}
