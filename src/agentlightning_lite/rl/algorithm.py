"""What the training step asks of an algorithm, so that the step never asks which algorithm it runs.

Every algorithm says how many rollouts a task gets, which of them count, and which engine plays the
policy in them (:class:`Algorithm`). One that updates the weights (``agl.GRPO``, ``agl.PPO``,
``agl.SFT``: :class:`WeightUpdate`) also says what its samples need (values, a reference model) and
updates one policy on them with what a :class:`StepContext` gives it (the step, its timer, the
model's settings, the functions that train and hand the weights over), never the learner itself.
One that works on the rollout side only (``agl.APO``: :class:`RolloutOnly`) is handed the trainer's
rollout session and runs itself.
Each checks its own settings when it is built.

>>> import agentlightning_lite as agl
>>> [isinstance(a, WeightUpdate) for a in (agl.GRPO(), agl.PPO(), agl.SFT())]
[True, True, True]
>>> agl.PPO().needs_values, agl.GRPO(kl_coef=0.1).needs_reference, agl.SFT().updates_weights
(True, True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .batching import Sample
    from .policies import Policy
    from .timing import Timer

__all__ = ["Algorithm", "RolloutOnly", "StepContext", "WeightUpdate", "rollout_only"]


@dataclass(frozen=True)
class StepContext:
    """What a :class:`WeightUpdate` sees of the step it updates (the learner builds one per step).

    Attributes:
        step: the step being learned; ``seed``: the run's seed (SFT's shuffles derive from both).
        timer: the step's phases (``with ctx.timer.phase("advantages"): ...``).
        merged: samples are merged trajectories (``SampleConfig(transitions="trajectory")``).
        pad_id, autocast: the training model's padding token and the dtype the update autocasts to.
        train: ``train(policy, update)`` runs ``update(model)`` with ``policy``'s adapter active, then
            hands the new weights to the engine.
        optimise: ``optimise(samples, policy, model)``: the policy-gradient epochs on samples whose
            advantages are set (without handing the weights over); returns the metrics.

    >>> ctx = StepContext(step=3, seed=0, timer=None, merged=False, pad_id=0, autocast=None,
    ...                   train=lambda policy, update: None, optimise=lambda s, p, m: {})
    >>> ctx.step, ctx.merged
    (3, False)
    """

    step: int
    seed: int
    timer: Timer
    merged: bool
    pad_id: int
    autocast: Any
    train: Callable[[Policy, Callable[[Any], None]], None]
    optimise: Callable[[list[Sample], Policy, Any], dict[str, float]]


@runtime_checkable
class Algorithm(Protocol):
    """The rollout side of an algorithm: what every one of them says."""

    #: rollouts per task in a step
    group_size: int

    @property
    def min_reward(self) -> float | None:
        """A rollout whose final reward is below this (or missing) gives no samples (``None``: all count)."""
        ...

    @property
    def updates_weights(self) -> bool:
        """``True``: a :class:`WeightUpdate`; ``False``: a :class:`RolloutOnly` algorithm."""
        ...

    def rollout_engine(self) -> Any | None:
        """The engine that plays the policy in the rollouts (``SFT(teacher=...)``'s teacher), or
        ``None``: the policy itself."""
        ...


@runtime_checkable
class WeightUpdate(Algorithm, Protocol):
    """An algorithm that updates the policy's weights on the samples of its rollouts."""

    @property
    def lr(self) -> float: ...

    @property
    def weight_decay(self) -> float: ...

    @property
    def needs_values(self) -> bool:
        """Whether the update trains a value head (and its samples need the old values)."""
        ...

    @property
    def needs_reference(self) -> bool:
        """Whether the loss reads the reference model's logprobs (a KL term)."""
        ...

    def value_head_lr(self) -> float:
        """The value head's learning rate (read when :attr:`needs_values`)."""
        ...

    def update(self, ctx: StepContext, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        """Update ``policy`` on its ``samples`` (advantages, loss, steps) with the step's ``ctx``; returns
        the metrics (``"train/skipped_update": 1.0`` when there was nothing to learn from)."""
        ...


@runtime_checkable
class RolloutOnly(Algorithm, Protocol):
    """An algorithm that changes what the agent reads, not the weights (``agl.APO``)."""

    def run(
        self,
        trainer: Any,
        agent: Callable[..., Any],
        train_dataset: Sequence[Any],
        val_dataset: Sequence[Any] | None = None,
        resume: bool = False,
    ) -> dict[str, Any]:
        """Run with ``trainer``'s rollout session (:attr:`~.trainer.Trainer.rollouts`), store, metrics
        and output directory; what ``Trainer.fit`` returns."""
        ...


def rollout_only(algorithm: object) -> RolloutOnly | None:
    """``algorithm`` when it works on the rollout side only (``agl.APO``), else ``None``.

    >>> import agentlightning_lite as agl
    >>> rollout_only(agl.GRPO()) is None, rollout_only("grpo") is None
    (True, True)
    """
    if isinstance(algorithm, RolloutOnly) and not algorithm.updates_weights:
        return algorithm
    return None
