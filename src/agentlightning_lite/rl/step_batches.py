"""Where ``Trainer.fit``'s steps get their rollouts: one loop, two batch sources.

``fit`` runs one loop: take the next step's batch from a :class:`BatchSource`, update on its samples
(``Trainer``'s own step: the same update and metrics, memory included, whichever source), tell the
source the update is done, log. :class:`SyncBatches` rolls out each step's tasks when asked (the
rollouts wait for the previous update); ``async_rollouts.AsyncBatches`` has them rolled out ahead by
a producer thread. A source is a context manager: leaving it with an error (Ctrl-C) cancels the
rollouts it still runs.

>>> batches = SyncBatches(trainer.rollouts, agent, tasks, batch_size=2, seed=0,  # doctest: +SKIP
...                       position=(0, 0), algorithm=trainer.algorithm)
>>> with batches:  # doctest: +SKIP
...     got = batches.next(0, Timer())
>>> got.position, len(got.batch.results)  # doctest: +SKIP
((0, 2), 8)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, runtime_checkable

from .algorithm import Algorithm
from .samples import next_tasks
from .session import RolloutBatch, Rollouts
from .timing import Timer

__all__ = ["BatchSource", "StepBatch", "SyncBatches"]


@dataclass
class StepBatch:
    """One step's rollouts and samples, with the data position after its tasks and the source's own
    metrics (``async/...``)."""

    batch: RolloutBatch
    position: tuple[int, int]
    metrics: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class BatchSource(Protocol):
    """Gives ``fit`` each step's batch; a context manager (leaving it with an error cancels its rollouts)."""

    def next(self, step: int, timer: Timer) -> StepBatch:
        """The batch of ``step`` (its phases, ``rollouts`` and ``samples``, timed on ``timer``)."""
        ...

    def done(self, step: int, metrics: dict[str, Any]) -> None:
        """The update of ``step`` is done (its weights handed over); add the source's step metrics."""
        ...

    def __enter__(self) -> BatchSource: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class SyncBatches:
    """Each step's tasks rolled out when the step asks for them (after the previous update)."""

    def __init__(
        self,
        rollouts: Rollouts,
        agent: Callable[..., Any],
        dataset: Sequence[Any],
        batch_size: int,
        seed: int,
        position: tuple[int, int],
        algorithm: Algorithm,
    ) -> None:
        self.rollouts, self.agent, self.dataset = rollouts, agent, dataset
        self.batch_size, self.seed, self.position, self.algorithm = batch_size, seed, position, algorithm

    def next(self, step: int, timer: Timer) -> StepBatch:
        tasks, self.position = next_tasks(self.dataset, self.batch_size, self.seed, self.position)
        return StepBatch(self.rollouts.step(self.agent, tasks, step, self.algorithm, timer), self.position)

    def done(self, step: int, metrics: dict[str, Any]) -> None:
        return None

    def __enter__(self) -> SyncBatches:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        return None  # a step's rollouts run in the caller's thread: an error there gave them up already
