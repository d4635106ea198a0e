"""Sample building: a step's tasks, and its rollouts -> the store's transitions -> training samples.

Which rollouts count (failed ones dropped or given ``failed_reward``; SFT keeps the good ones only),
which calls (the trained agents'), and which of those are skipped: too long for ``max_seq_len``, or
made by weights more than ``max_staleness`` updates older than the engine's now.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from ..air import AIRRule
from ..credit import CreditRule
from ..store.base import Store
from ..transitions import transitions
from .batching import Sample
from .diagnostics import step_diagnostics
from .rollouts import RolloutResult

__all__ = ["build_samples", "kept_rollouts", "next_tasks", "too_stale"]


def next_tasks(
    dataset: Sequence[Any], n: int, seed: int, position: tuple[int, int]
) -> tuple[list[tuple[int, Any]], tuple[int, int]]:
    """The next ``n`` (index, task) pairs of a seeded per-epoch shuffle, from data position
    ``position`` (epoch, index in the epoch's shuffle); returns them and the position after them."""
    epoch, cursor = position
    out: list[tuple[int, Any]] = []
    while len(out) < n:
        order = list(range(len(dataset)))
        random.Random(seed * 100_003 + epoch).shuffle(order)
        if cursor >= len(order):
            epoch, cursor = epoch + 1, 0
            continue
        i = order[cursor]
        cursor += 1
        out.append((i, dataset[i]))
    return out, (epoch, cursor)


def too_stale(version: int, made_by: int | None, max_staleness: int | None) -> bool:
    """Whether a call made by weights ``made_by`` is more than ``max_staleness`` updates behind
    ``version`` (the rule both the sample filter and asynchronous training's group drop apply).

    >>> too_stale(5, 3, 1), too_stale(5, 4, 1), too_stale(5, None, 1), too_stale(5, 0, None)
    (True, False, False, False)
    """
    return max_staleness is not None and made_by is not None and version - made_by > max_staleness


def kept_rollouts(
    results: Sequence[RolloutResult], store: Store, failed_reward: str | float, min_reward: float | None
) -> list[RolloutResult]:
    """The rollouts whose calls are trained; a failed one kept with ``failed_reward`` gets it in the store."""
    keep: list[RolloutResult] = []
    for r in results:
        if not r.rollout_id:  # never ran (a remote rollout given up before any runner took it)
            continue
        if min_reward is not None and (r.reward is None or r.reward < min_reward):
            continue  # SFT trains on good episodes only
        if r.status == "succeeded" and r.reward is not None:
            keep.append(r)
        elif r.status != "succeeded" and failed_reward != "drop":
            store.set_reward(r.rollout_id, float(failed_reward))
            keep.append(r)
    return keep


def build_samples(
    results: Sequence[RolloutResult],
    store: Store,
    *,
    version: int,
    failed_reward: str | float = "drop",
    min_reward: float | None = None,
    agents: Sequence[str] | None = None,
    agent_policy: Mapping[str, str] | None = None,
    credit: CreditRule | None = None,
    air: Sequence[AIRRule] | None = None,
    max_seq_len: int = 2048,
    max_staleness: int | None = None,
    truncated: str = "keep",
    truncated_reward: float = 0.0,
) -> tuple[list[Sample], dict[str, float]]:
    """The training samples of ``results`` and their counts (``train/samples``, ``..._too_long``,
    ``samples/truncated``...).

    ``version`` is the engine's weights version now; ``agents`` the trained agents (``None``: all);
    ``agent_policy`` maps an agent to the policy its calls train (``sample.meta["policy"]``; an agent
    not in it trains ``"default"``); ``truncated``/``truncated_reward``: what a call cut at
    ``max_tokens`` trains as (:class:`~.config.SampleConfig`: ``"keep"``, ``"mask"``: ``meta["masked"]``,
    ``"penalty"``: its reward is ``truncated_reward``).
    """
    keep = kept_rollouts(results, store, failed_reward, min_reward)
    by_id = {r.rollout_id: r for r in keep}
    policy_of = dict(agent_policy or {})
    ts = transitions(
        store,
        rollout_ids=list(by_id),
        agents=list(agents) if agents is not None else None,
        credit=credit,
        air=list(air) if air is not None else None,
        require_tokens=True,
    )
    samples: list[Sample] = []
    too_long = stale = cut = 0
    for t in ts:
        assert t.prompt_token_ids is not None and t.response_token_ids is not None
        if not t.response_token_ids or t.reward is None:
            continue
        if too_stale(version, t.metadata.get("weights_version"), max_staleness):
            stale += 1  # off-policy beyond the limit: made by weights too old
            continue
        if len(t.prompt_token_ids) + len(t.response_token_ids) > max_seq_len:
            too_long += 1
            continue
        r = by_id[t.rollout_id]
        params: dict[str, Any] = t.metadata.get("params") or {}
        meta: dict[str, Any] = {"policy": policy_of.get(t.agent or "", "default")}
        reward = float(t.reward)
        if t.finish_reason == "length":  # cut at max_tokens: SampleConfig.truncated says how it trains
            cut += 1
            meta["truncated"] = True
            if truncated == "mask":
                meta["masked"] = True
            elif truncated == "penalty":
                reward = float(truncated_reward)
        samples.append(
            Sample(
                prompt_ids=t.prompt_token_ids,
                response_ids=t.response_token_ids,
                engine_logprobs=t.response_logprobs,
                reward=reward,
                group=r.spec.metadata.get("task_index"),
                temperature=float(params.get("temperature", 1.0) or 1.0),
                rollout_id=t.rollout_id,
                index=t.index,
                agent=t.agent,
                meta=meta,
            )
        )
    stats = {
        "train/samples": float(len(samples)),
        "train/samples_too_long": float(too_long),
        "train/samples_stale": float(stale),
        "samples/truncated": float(cut),
        "train/calls_per_rollout": len(ts) / max(len(keep), 1),
    }
    stats.update(step_diagnostics(results, store, agent_policy))  # warns at once when no call was served
    return samples, stats
