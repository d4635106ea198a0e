"""Scoring rollouts: evaluation summaries, a step's metrics, and the stop on failed steps."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ._runtime import memory_stats
from .config import RolloutConfig
from .rollouts import RolloutResult
from .timing import Timer

if TYPE_CHECKING:
    from .session import RolloutBatch

__all__ = [
    "FailedSteps",
    "evaluation_summary",
    "reward_of",
    "rollout_metrics",
    "step_metrics",
    "success_rate",
    "validation_metrics",
]


def reward_of(r: RolloutResult, failed_reward: str | float) -> float | None:
    """A rollout's reward; a failed one's is ``failed_reward`` (``None`` when it is ``"drop"``)."""
    if r.status == "succeeded":
        return r.reward
    return None if failed_reward == "drop" else float(failed_reward)


def success_rate(results: Sequence[RolloutResult], threshold: float) -> float:
    """The share of rollouts that succeeded with a reward of at least ``threshold`` (NaN for none)."""
    if not results:
        return float("nan")
    ok = sum(1 for r in results if r.status == "succeeded" and (r.reward or 0.0) >= threshold)
    return ok / len(results)


def evaluation_summary(results: Sequence[RolloutResult], config: RolloutConfig) -> dict[str, Any]:
    """``mean_reward``, ``success_rate``, ``n`` and ``failed`` of evaluation rollouts."""
    scored = [x for x in (reward_of(r, config.failed_reward) for r in results) if x is not None]
    return {
        "mean_reward": statistics.fmean(scored) if scored else float("nan"),
        "success_rate": success_rate(results, config.success_threshold),
        "n": len(results),
        "failed": sum(r.status != "succeeded" for r in results),
    }


def rollout_metrics(results: Sequence[RolloutResult], config: RolloutConfig) -> dict[str, float]:
    """A training step's rollout metrics (``train/reward_mean``, ``train/success_rate``...)."""
    rewards = [r.reward for r in results if r.status == "succeeded" and r.reward is not None]
    return {
        "train/reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
        "train/success_rate": success_rate(results, config.success_threshold),
        "train/rollouts": float(len(results)),
        "train/failed_rollouts": float(sum(r.status == "failed" for r in results)),
        "train/timeout_rollouts": float(sum(r.status == "timeout" for r in results)),
    }


def step_metrics(
    batch: RolloutBatch, update: Mapping[str, float], timer: Timer, config: RolloutConfig, version: int
) -> dict[str, Any]:
    """A training step's metrics: its rollouts' outcomes, the time of its rollouts and update
    (``learn`` on ``timer``), the engine's policy version, memory, the samples' counts, the
    update's metrics and the phases' timings."""
    learn_s = timer.seconds.pop("learn")
    return {
        **rollout_metrics(batch.results, config),
        "time/rollouts_s": timer.seconds["rollouts"],
        "time/update_s": learn_s,
        "engine/version": float(version),
        **memory_stats(),
        **batch.stats,
        **update,
        **timer.metrics(),
    }


class FailedSteps:
    """Counts steps in a row in which no rollout succeeded; :meth:`check` stops training past the limit."""

    def __init__(self) -> None:
        self.count = 0
        self.first_failure: tuple[str, str | None] | None = None  # (status, error) of the first rollout

    def record(self, results: Sequence[RolloutResult]) -> None:
        if results and not any(r.status == "succeeded" for r in results):
            self.count += 1
            self.first_failure = (results[0].status, results[0].error)
        elif results:
            self.count = 0

    def check(self, limit: int | None, step: int) -> None:
        """Raise ``RuntimeError`` once ``limit`` steps in a row had no successful rollout."""
        if limit is None or self.count < limit or self.first_failure is None:
            return
        status, error = self.first_failure
        n, first = self.count, step - self.count + 1
        steps = f"step {step}" if n == 1 else f"{n} steps in a row (steps {first}-{step})"
        raise RuntimeError(
            f"every rollout of {steps} failed or timed out, so there is nothing to train on "
            f"(max_failed_steps={limit}; None never stops). The last step's first rollout ended "
            f"{status!r} with: {error or 'no error recorded'}"
        )


def validation_metrics(summary: Mapping[str, Any]) -> dict[str, float]:
    """The ``val/*`` metrics ``fit`` logs from an :func:`evaluation_summary`."""
    return {"val/reward_mean": summary["mean_reward"], "val/success_rate": summary["success_rate"]}
