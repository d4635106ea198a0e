"""Asynchronous training: a producer thread rolls out the next steps while the learner updates.

With ``RolloutConfig(async_rollouts=True)``, ``Trainer.fit`` takes its steps' batches from an
:class:`AsyncBatches` source instead of rolling each step out when it starts (the loop, the update and
the step metrics are the same; see :mod:`.step_batches`). A :class:`Producer` thread draws the next
steps' tasks and runs each step's batch, in a thread of its own, through the session's rollout
source (threads of this process, remote runners, Ray); it starts the batch of step ``j`` once the
update of step ``j - k - 1`` is done (``k``: the staleness bound), so it never runs more than ``k``
steps ahead. The learner takes each finished batch, drops the GRPO
groups with a call made by weights more than ``k`` versions older than the ones it trains
(:func:`split_stale`: a group is kept or dropped whole), updates, and hands the weights over. Every
call keeps the version that served it (the span's ``weights_version``), so a rollout whose calls
span a hand-over is judged call by call. ``handover="drain"`` pauses the engine for each switch (new
requests wait, the ones in flight finish first: ``engine.paused()``, through :class:`RequestGate`).

Metrics per step: ``time/learner_wait_s`` (seconds the learner waited for rollouts) and
``async/learner_idle_share`` (its share of the step), ``async/staleness_mean`` and ``_max`` and a
histogram ``async/staleness_<n>`` (calls by how many versions old they were), ``async/dropped_stale``
(rollouts dropped as too old) and ``async/dropped_groups``. When ``fit`` stops with an error (or
Ctrl-C) the rollouts still running are cancelled (marked ``failed`` in the store, their engine requests
cancelled) and ``fit`` returns at once; batches rolled out ahead but not trained are logged as a
warning with their count.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from .algorithm import Algorithm
from .distributed import DataParallel
from .rollouts import RolloutResult
from .samples import next_tasks, too_stale
from .session import RolloutBatch, Rollouts
from .sources import CancellableSource
from .step_batches import StepBatch
from .timing import Timer
from .weights import WeightHandOver

__all__ = ["AsyncBatches", "Produced", "Producer", "RequestGate", "split_stale"]

#: seconds :meth:`Producer.stop` waits for its threads once their rollouts are cancelled
STOP_WAIT_S = 5.0

logger = logging.getLogger(__name__)


@dataclass
class Produced:
    """One step's finished rollouts, made ahead by the producer."""

    step: int
    results: list[RolloutResult]
    position: tuple[int, int]  #: the data position (epoch, cursor) after this step's tasks
    seconds: float  #: how long the rollouts took
    started: float = 0.0  #: ``time.time()`` when the batch started


class Producer:
    """Background threads running the rollouts of steps ``first_step .. last_step - 1``.

    ``run_step(step, tasks)`` runs one step's tasks to their results; ``draw(position)`` gives the
    next tasks and the position after them (drawn in step order). The batch of step ``j`` starts, in
    a thread of its own, once :meth:`updated` has been called for step ``j - ahead - 1`` (``ahead =
    0``: each step's rollouts wait for the previous update, as without a producer), so with
    ``ahead >= 1`` the next step's rollouts start while the learner still waits for the current
    ones. :meth:`take` returns the batches in step order and raises the first error; :meth:`stop`
    starts nothing more and joins every thread (each finishes the batch it runs).
    """

    def __init__(
        self,
        run_step: Callable[[int, list[tuple[int, Any]]], list[RolloutResult]],
        draw: Callable[[tuple[int, int]], tuple[list[tuple[int, Any]], tuple[int, int]]],
        first_step: int,
        last_step: int,
        position: tuple[int, int],
        ahead: int,
    ) -> None:
        self._run_step, self._draw = run_step, draw
        self.next_step, self.last_step, self.position, self.ahead = first_step, last_step, position, ahead
        self.updated_through = first_step - 1  #: the last step whose update is done
        self._want = first_step  #: the step :meth:`take` returns next
        self._ready: dict[int, Produced] = {}
        self._error: BaseException | None = None
        self._stopping = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._loop, name="agl-rollout-producer", daemon=True)
        self._workers: list[threading.Thread] = []

    def start(self) -> Producer:
        self._thread.start()
        return self

    def _may_start(self) -> bool:
        return (
            self._stopping
            or self._error is not None
            or self.next_step - self.ahead - 1 <= self.updated_through
        )

    def _loop(self) -> None:
        try:
            while True:
                with self._cond:
                    self._cond.wait_for(self._may_start)
                    if self._stopping or self._error is not None or self.next_step >= self.last_step:
                        return
                    step = self.next_step
                tasks, position = self._draw(self.position)
                worker = threading.Thread(
                    target=self._batch, args=(step, tasks, position), name="agl-rollout-producer", daemon=True
                )
                with self._cond:
                    self.position, self.next_step = position, step + 1
                    self._workers.append(worker)
                worker.start()
        except BaseException as exc:  # surfaced by take()
            self._fail(exc)

    def _batch(self, step: int, tasks: list[tuple[int, Any]], position: tuple[int, int]) -> None:
        try:
            started, t0 = time.time(), time.perf_counter()
            results = self._run_step(step, tasks)
            done = Produced(step, results, position, time.perf_counter() - t0, started)
            with self._cond:
                self._ready[step] = done
                self._cond.notify_all()
        except BaseException as exc:  # surfaced by take()
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None:
                self._error = exc
            self._cond.notify_all()

    def take(self, poll_s: float = 0.2) -> Produced:
        """The next step's batch (waiting for it); the producer's error if it failed."""
        with self._cond:
            while self._want not in self._ready:
                if self._error is not None:
                    raise RuntimeError(f"the rollout producer failed: {self._error!r}") from self._error
                if not self._thread.is_alive() and self._want >= self.next_step:
                    raise RuntimeError("the rollout producer stopped without a batch")
                self._cond.wait(poll_s)  # a timeout, so that Ctrl-C reaches the main thread
            self._want += 1
            return self._ready.pop(self._want - 1)

    def updated(self, step: int) -> None:
        """The update of ``step`` is done (the weights are handed over): later batches may start."""
        with self._cond:
            self.updated_through = max(self.updated_through, step)
            self._cond.notify_all()

    def stop(self, cancel: Callable[[], None] | None = None) -> list[Produced]:
        """Start nothing more and join the threads: each finishes its batch, or, with ``cancel`` (run
        first: it gives up the rollouts in flight), within :data:`STOP_WAIT_S` seconds. Returns the
        batches never taken."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        threads = [t for t in [self._thread, *self._workers] if t is not threading.current_thread()]
        if cancel is None:
            for thread in threads:
                thread.join()
        deadline = time.monotonic() + STOP_WAIT_S
        while cancel is not None and any(t.is_alive() for t in threads) and time.monotonic() < deadline:
            cancel()  # again while threads run: a batch may have started its rollouts meanwhile
            for thread in threads:
                thread.join(0.1)
        if any(t.is_alive() for t in self._workers):
            logger.warning("a rollout batch still runs after fit stopped (its source cannot cancel it)")
        with self._cond:
            left, self._ready = sorted(self._ready.values(), key=lambda b: b.step), {}
        return left


def call_versions(store: Store, rollout_id: str) -> list[int]:
    """The ``weights_version`` of each policy call of a rollout (calls without one are left out)."""
    out = []
    for s in store.spans(rollout_id):
        v = s.attributes.get("weights_version") if s.kind == "llm" else None
        if v is not None:
            out.append(int(v))
    return out


def split_stale(
    results: Sequence[RolloutResult], store: Store, version: int, max_staleness: int
) -> tuple[list[RolloutResult], list[RolloutResult], list[int]]:
    """``(kept, dropped, staleness of each kept call)``: a group (the rollouts of one task in a step)
    is dropped whole when any of its calls was made by weights more than ``max_staleness`` versions
    older than ``version``."""
    groups: dict[Any, list[RolloutResult]] = defaultdict(list)
    for r in results:
        meta = r.spec.metadata
        groups[(meta.get("step"), meta.get("task_index", id(r)))].append(r)
    kept: list[RolloutResult] = []
    dropped: list[RolloutResult] = []
    ages: list[int] = []
    for members in groups.values():
        made_by = [v for r in members if r.rollout_id for v in call_versions(store, r.rollout_id)]
        if any(too_stale(version, v, max_staleness) for v in made_by):
            dropped.extend(members)
        else:
            kept.extend(members)
            ages.extend(version - v for v in made_by)
    order = {id(r): i for i, r in enumerate(results)}
    kept.sort(key=lambda r: order[id(r)])
    return kept, dropped, ages


class RequestGate:
    """Closes the engine to requests while its weights switch, through the engine's own pause.

    Inside :meth:`closed` (``engine.paused()``) a new request is held until the switch is over, and
    the switch starts only when no request is decoding. ``switches`` holds the ``time.time()`` span
    of each switch.
    """

    def __init__(self, engine: ServingEngine) -> None:
        self.engine = engine
        self.switches: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        """No request decodes inside: new ones wait, the ones in flight finish first."""
        with self.engine.paused():
            t0 = time.time()
            try:
                yield
            finally:
                self.switches.append((t0, time.time()))


class DrainingHandOver(WeightHandOver):
    """A :class:`~.weights.WeightHandOver` whose switches happen with the request gate closed."""

    def __init__(self, inner: WeightHandOver, gate: RequestGate) -> None:
        super().__init__(inner.engine, inner.model)
        self.gate = gate

    def apply(self, update: Callable[[Any], None], adapters: Sequence[str | None] = (None,)) -> None:
        if self.in_place:  # the update runs inside the engine's switch
            with self.gate.closed():
                super().apply(update, adapters)
            return
        super().apply(update, adapters)  # trains, then push() switches with the gate closed

    def push(self, adapters: Sequence[str | None] = (None,)) -> None:
        if self.in_place:
            return
        with self.gate.closed():
            super().push(adapters)


class AsyncBatches:
    """The batches of steps ``first_step .. last_step - 1``, rolled out ahead by a :class:`Producer`
    (at most ``max_staleness`` steps ahead, default 1) and cut down to the groups fresh enough to train
    (:func:`split_stale`). A :class:`~.step_batches.BatchSource` of ``Trainer.fit``; with
    ``handover="drain"`` the learner's hand-overs pause the engine while it is open."""

    def __init__(
        self,
        rollouts: Rollouts,
        agent: Callable[..., Any],
        dataset: Sequence[Any],
        batch_size: int,
        seed: int,
        position: tuple[int, int],
        algorithm: Algorithm,
        *,
        first_step: int,
        last_step: int,
        max_staleness: int | None,
        learner: Any = None,
        handover: str = "finish",
    ) -> None:
        if DataParallel.active():
            raise ValueError("async_rollouts does not run under a data-parallel launcher yet")
        self.rollouts, self.algorithm, self.learner, self.handover = rollouts, algorithm, learner, handover
        self.k = 1 if max_staleness is None else int(max_staleness)
        self.first_step = first_step

        def run_step(step: int, tasks: list[tuple[int, Any]]) -> list[RolloutResult]:
            return rollouts.step_results(agent, tasks, step, algorithm)

        def draw(at: tuple[int, int]) -> tuple[list[tuple[int, Any]], tuple[int, int]]:
            return next_tasks(dataset, batch_size, seed, at)

        self.producer = Producer(run_step, draw, first_step, last_step, position, self.k)
        self._handover = contextlib.ExitStack()  # the learner's draining hand-over, while open
        self._mark, self._waited = 0.0, 0.0

    def __enter__(self) -> AsyncBatches:
        with contextlib.ExitStack() as opening:
            if self.handover == "drain" and self.learner is not None:
                gate = RequestGate(self.rollouts.engine)
                opening.enter_context(
                    self.learner.using_weights(DrainingHandOver(self.learner.weights, gate))
                )
            self.producer.start()
            self._handover = opening.pop_all()  # started: the hand-over stays until __exit__
        self._mark = time.perf_counter()
        return self

    def next(self, step: int, timer: Timer) -> StepBatch:
        t0 = time.perf_counter()
        batch = self.producer.take()
        self._waited = time.perf_counter() - t0
        version = int(self.rollouts.engine.version)
        timer.add("rollouts", batch.seconds)  # run ahead, overlapping the previous updates
        with timer.phase("samples"):
            kept, dropped, ages = split_stale(batch.results, self.rollouts.store, version, self.k)
            samples, stats = self.rollouts.samples(kept, self.algorithm.min_reward)
        hist = Counter(ages)
        metrics = {
            "time/learner_wait_s": self._waited,
            "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
            "async/staleness_max": float(max(ages, default=0)),
            **{f"async/staleness_{n}": float(c) for n, c in sorted(hist.items())},
            "async/dropped_stale": float(len(dropped)),
            "async/dropped_groups": float(len({_group(r) for r in dropped})),
        }
        return StepBatch(RolloutBatch(batch.results, samples, stats, version), batch.position, metrics)

    def done(self, step: int, metrics: dict[str, Any]) -> None:
        self.producer.updated(step)
        now = time.perf_counter()
        wall, self._mark = now - self._mark, now
        metrics["async/learner_idle_share"] = self._waited / wall if wall > 0 else 0.0

    def cancel(self) -> None:
        """Give up the rollouts in flight: the source's collects return, and every training rollout of
        this run still running is marked ``failed`` in the store with its engine requests cancelled."""
        source, store, server = self.rollouts.source, self.rollouts.store, self.rollouts.server
        if isinstance(source, CancellableSource):
            source.cancel()
        for r in store.rollouts(mode="train", status="running"):
            if int(r.metadata.get("step", -1)) >= self.first_step:
                store.finish_rollout(
                    r.rollout_id, status="failed", error="CancelledError: fit stopped", only_if_running=True
                )
                if server is not None:
                    server.cancel_rollout(r.rollout_id)

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with self._handover:  # the learner's own hand-over is back after, on an error too
            unused = self.producer.stop(cancel=self.cancel if exc is not None else None)
        n = sum(len(b.results) for b in unused)
        if n:
            logger.warning(
                "%d rollouts of steps %s were rolled out ahead but not trained (fit stopped first); "
                "they stay in the store",
                n,
                [b.step for b in unused],
            )


def _group(r: RolloutResult) -> tuple[Any, Any]:
    return r.spec.metadata.get("step"), r.spec.metadata.get("task_index")
