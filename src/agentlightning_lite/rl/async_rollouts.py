"""Asynchronous training: a producer thread rolls out the next steps while the learner updates.

With ``RolloutConfig(async_rollouts=True)``, ``Trainer.fit`` runs this loop instead of alternating.
A :class:`Producer` thread draws the next steps' tasks and runs each step's batch, in a thread of
its own, through the session's rollout source (threads of this process, remote runners, Ray); it
starts the batch of step ``j`` once the update of step ``j - k - 1`` is done (``k``: the staleness
bound), so it never runs more than ``k`` steps ahead. The learner takes each finished batch, drops the GRPO
groups with a call made by weights more than ``k`` versions older than the ones it trains
(:func:`split_stale`: a group is kept or dropped whole), updates, and hands the weights over. Every
call keeps the version that served it (the span's ``weights_version``), so a rollout whose calls
span a hand-over is judged call by call. ``handover="drain"`` holds new requests and lets the ones in
flight finish before each switch (:class:`RequestGate`).

Metrics per step: ``time/learner_wait_s`` (seconds the learner waited for rollouts) and
``async/learner_idle_share`` (its share of the step), ``async/staleness_mean`` and ``_max`` and a
histogram ``async/staleness_<n>`` (calls by how many versions old they were), ``async/dropped_stale``
(rollouts dropped as too old) and ``async/dropped_groups``. Batches rolled out ahead but not trained
when ``fit`` stops (an error, Ctrl-C) are logged as a warning with their count.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..store.base import Store
from ._memory import release_host_memory
from ._runtime import release_cuda_cache
from .distributed import DataParallel
from .evaluation import rollout_metrics
from .rollouts import RolloutResult
from .samples import next_tasks, too_stale
from .timing import Timer
from .weights import WeightHandOver

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["Produced", "Producer", "RequestGate", "fit_async", "split_stale"]

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

    def stop(self) -> list[Produced]:
        """Start nothing more, join the threads (each finishes its batch); the batches never taken."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in [self._thread, *self._workers]:
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join()
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
    """Holds the engine's new requests and waits for the ones in flight while weights switch.

    :meth:`install` routes ``engine.submit`` and ``engine.cancel`` through the gate (restored by
    :meth:`remove`); inside :meth:`closed`, a new request gets a future that is submitted once the
    switch is over, and the switch starts only when no request is decoding. ``switches`` holds the
    ``time.time()`` span of each switch.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.switches: list[tuple[float, float]] = []
        self._cond = threading.Condition()
        self._open, self._in_flight = True, 0
        self._held: list[tuple[Any, concurrent.futures.Future[Any]]] = []
        self._forward: dict[concurrent.futures.Future[Any], concurrent.futures.Future[Any]] = {}
        self._submit: Callable[[Any], concurrent.futures.Future[Any]] = engine.submit
        self._cancel: Callable[[concurrent.futures.Future[Any]], bool] = engine.cancel
        self._before: dict[str, Any] = {}

    def install(self) -> RequestGate:
        self._submit, self._cancel = self.engine.submit, self.engine.cancel
        self._before = {n: self.engine.__dict__.get(n) for n in ("submit", "cancel")}
        setattr(self.engine, "submit", self.submit)  # noqa: B010  (an instance attribute, removed later)
        setattr(self.engine, "cancel", self.cancel)  # noqa: B010
        return self

    def remove(self) -> None:
        for name, before in self._before.items():
            if before is None:
                self.engine.__dict__.pop(name, None)
            else:
                setattr(self.engine, name, before)

    def submit(self, request: Any) -> concurrent.futures.Future[Any]:
        with self._cond:
            if not self._open:
                held: concurrent.futures.Future[Any] = concurrent.futures.Future()
                self._held.append((request, held))
                return held
            self._in_flight += 1
        try:
            future = self._submit(request)
        except BaseException:
            self._finished(None)
            raise
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Any) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def cancel(self, future: concurrent.futures.Future[Any]) -> bool:
        with self._cond:
            for i, (_req, held) in enumerate(self._held):
                if held is future:
                    del self._held[i]
                    return future.cancel()
            inner = self._forward.get(future)
        if inner is not None:
            return self._cancel(inner)
        return self._cancel(future)

    @contextlib.contextmanager
    def closed(self) -> Iterator[None]:
        """No request decodes inside: new ones wait, the ones in flight finish first."""
        with self._cond:
            self._open = False
            self._cond.wait_for(lambda: self._in_flight == 0)
        t0 = time.time()
        try:
            yield
        finally:
            with self._cond:
                self._open = True
                held, self._held = self._held, []
                self.switches.append((t0, time.time()))
            for request, outer in held:
                if outer.set_running_or_notify_cancel():
                    self._pass_on(request, outer)

    def _pass_on(self, request: Any, outer: concurrent.futures.Future[Any]) -> None:
        try:
            inner = self.submit(request)
        except BaseException as exc:  # the request's caller gets it
            outer.set_exception(exc)
            return
        with self._cond:
            self._forward[outer] = inner

        def copy(f: concurrent.futures.Future[Any]) -> None:
            with self._cond:
                self._forward.pop(outer, None)
            if f.cancelled():
                outer.set_exception(concurrent.futures.CancelledError())
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(copy)


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


def fit_async(
    trainer: Trainer,
    agent: Callable[..., Any],
    train_dataset: Sequence[Any],
    total: int,
    end_step: Callable[[dict[str, Any], Sequence[RolloutResult]], None],
) -> dict[str, Any]:
    """Train until step ``total`` with a producer rolling out ahead; after each step
    ``end_step(metrics, results)`` (``fit``'s own: count failures, validate, log, stop on failed
    steps, checkpoint, progress). Returns the last step's metrics."""
    if DataParallel.active():
        raise ValueError("async_rollouts does not run under a data-parallel launcher yet")
    staleness = trainer.sample_config.max_staleness
    k = 1 if staleness is None else int(staleness)
    algorithm = trainer.algorithm
    session, learner, store = trainer.rollouts, trainer.learner, trainer.store

    def run_step(step: int, tasks: list[tuple[int, Any]]) -> list[RolloutResult]:
        return session.step_results(agent, tasks, step, algorithm)

    def draw(position: tuple[int, int]) -> tuple[list[tuple[int, Any]], tuple[int, int]]:
        return next_tasks(train_dataset, trainer.batch_size, trainer.seed, position)

    gate: RequestGate | None = None
    weights = learner.weights
    if trainer.rollout_config.handover == "drain":
        gate = RequestGate(trainer.engine).install()
        learner.weights = DrainingHandOver(weights, gate)
    producer = Producer(run_step, draw, trainer.step, total, trainer.data_position, k).start()
    last: dict[str, Any] = {}
    mark = time.perf_counter()
    try:
        while trainer.step < total:
            timer = Timer(trainer.device)
            t0 = time.perf_counter()
            batch = producer.take()
            waited = time.perf_counter() - t0
            version = int(trainer.engine.version)
            with timer.phase("samples"):
                kept, dropped, ages = split_stale(batch.results, store, version, k)
                samples, stats = session.samples(kept, algorithm.min_reward)
            release_cuda_cache(trainer.device)
            with timer.phase("learn"):
                update_stats = learner.learn(samples, trainer.step, timer)
            release_host_memory()
            producer.updated(batch.step)
            trainer.step += 1
            trainer.data_position = batch.position
            now = time.perf_counter()
            wall, mark = now - mark, now
            hist = Counter(ages)
            last = {
                **rollout_metrics(batch.results, trainer.rollout_config),
                "time/rollouts_s": batch.seconds,
                "time/update_s": timer.seconds.pop("learn"),
                "time/learner_wait_s": waited,
                "async/learner_idle_share": waited / wall if wall > 0 else 0.0,
                "async/staleness_mean": sum(ages) / len(ages) if ages else 0.0,
                "async/staleness_max": float(max(ages, default=0)),
                **{f"async/staleness_{n}": float(c) for n, c in sorted(hist.items())},
                "async/dropped_stale": float(len(dropped)),
                "async/dropped_groups": float(len({_group(r) for r in dropped})),
                "engine/version": float(trainer.engine.version),
                **stats,
                **update_stats,
                **timer.metrics(),
            }
            end_step(last, batch.results)
    finally:
        unused = producer.stop()
        if gate is not None:
            gate.remove()
            learner.weights = weights
        n = sum(len(b.results) for b in unused)
        if n:
            logger.warning(
                "%d rollouts of steps %s were rolled out ahead but not trained (fit stopped first); "
                "they stay in the store",
                n,
                [b.step for b in unused],
            )
    return last


def _group(r: RolloutResult) -> tuple[Any, Any]:
    return r.spec.metadata.get("step"), r.spec.metadata.get("task_index")
