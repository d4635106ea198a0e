"""What the training step asks of an algorithm, so that the step never asks which algorithm it runs.

Every algorithm says how many rollouts a task gets, which of them count, and which engine plays the
policy in them (:class:`Algorithm`). One that updates the weights (``agl.GRPO``, ``agl.PPO``,
``agl.SFT``: :class:`WeightUpdate`) also says what its samples need (values, a reference model) and
updates one policy on them through the :class:`~.learner.Learner`. One that works on the rollout
side only (``agl.APO``: :class:`RolloutOnly`) is handed the trainer's rollout session and runs itself.
Each checks its own settings when it is built.

>>> import agentlightning_lite as agl
>>> [isinstance(a, WeightUpdate) for a in (agl.GRPO(), agl.PPO(), agl.SFT())]
[True, True, True]
>>> agl.PPO().needs_values, agl.GRPO(kl_coef=0.1).needs_reference, agl.SFT().updates_weights
(True, True, True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .batching import Sample
    from .learner import Learner
    from .policies import Policy

__all__ = ["Algorithm", "RolloutOnly", "WeightUpdate", "rollout_only"]


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

    def update(self, learner: Learner, policy: Policy, samples: list[Sample]) -> dict[str, float]:
        """Update ``policy`` on its ``samples`` (advantages, loss, steps) through ``learner``; returns
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
