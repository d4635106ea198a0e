"""The rollout queue of a disaggregated trainer: runners claim rollouts under leases they renew.

Each queued job (one rollout of the trainer's step) runs as one or more *attempts*. An attempt is a
rollout in the store, claimed by one runner worker under a lease of ``lease_timeout`` seconds that
the worker renews with heartbeats. A lease that runs out (the runner died or lost the network)
marks its rollout ``failed`` and puts the job back in the queue for another runner, up to
``max_attempts`` attempts in all; an attempt that runs past ``rollout_timeout`` is marked
``timeout``. Either way the job has exactly one outcome: no rollout is counted twice, none is lost.
A result that arrives after its attempt was given up is still recorded in the store (metadata
``late_result``), but the job's outcome stays as it was, so the trainer never trains on it.

Every claim carries a *lease token* (``Attempt.lease``, unguessable): the heartbeats, result,
reward and spans of that attempt are accepted only with it (the ``leases`` arguments; ``None`` is
an in-process caller, trusted), so one runner cannot act on another's rollout. A job retried after
its lease ran out is a new attempt: a new rollout with a new token, the old token is dead for it.

Memory stays flat however long training runs: an attempt that ended (result counted, lease lost,
timed out) is kept only as a small record (its token, weights version and how it ended) for the
last ``keep_ended`` ended attempts, long enough to recognise a late result or a retried call;
the queue holds no reference to a finished job.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from ..errors import InvalidRequestError, UnknownRolloutError
from ..store.base import Store
from ..store.rows import SpanRow
from ..types import check_reward
from .leases import (
    Attempt,
    EndedAttempt,
    Job,
    LeaseLost,
    LeaseMismatch,
    OutcomeCounted,
    lease_ok,
    rows_outcome,
)

__all__ = ["Attempt", "Job", "LeaseLost", "LeaseMismatch", "OutcomeCounted", "RolloutQueue"]

logger = logging.getLogger(__name__)

_FINISHED = ("succeeded", "failed", "timeout")
_NOT_OURS = "rollout {!r} was not handed out by this queue (or it ended long ago)"


class RolloutQueue:
    """A thread-safe queue of rollouts for remote runners (see the module docstring).

    ``version`` returns the policy's current weights version (recorded on each claim).
    ``keep_ended``: how many ended attempts are remembered for late results (the oldest go first).

    >>> import agentlightning_lite as agl
    >>> from agentlightning_lite.remote.queue import RolloutQueue
    >>> store = agl.MemoryStore()
    >>> q = RolloutQueue(store, lease_timeout=10.0)
    >>> [job] = q.submit([("2+2?", "train", {"step": 0})])
    >>> att = q.claim("worker-1")
    >>> att.job is job, store.get_rollout(att.rollout_id).status
    (True, 'running')
    >>> q.complete(att.rollout_id, "succeeded", reward=1.0)["counted"]
    True
    >>> job.status, job.reward
    ('succeeded', 1.0)
    """

    def __init__(
        self,
        store: Store,
        lease_timeout: float = 30.0,
        max_attempts: int = 3,
        rollout_timeout: float | None = None,
        version: Callable[[], int] = lambda: 0,
        keep_ended: int = 10_000,
    ) -> None:
        if lease_timeout <= 0:
            raise ValueError(f"lease_timeout must be > 0, got {lease_timeout}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if keep_ended < 0:
            raise ValueError(f"keep_ended must be >= 0, got {keep_ended}")
        self.store = store
        self.lease_timeout = float(lease_timeout)
        self.max_attempts = int(max_attempts)
        self.rollout_timeout = rollout_timeout
        self.version = version
        self.keep_ended = int(keep_ended)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._pending: deque[Job] = deque()
        self._attempts: dict[str, Attempt] = {}  # rollout id -> running attempt
        self._ended: OrderedDict[str, EndedAttempt] = OrderedDict()  # the last keep_ended ended attempts
        self._ids = itertools.count()
        self._waiters: set[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = set()
        self._workers: dict[str, float] = {}  # worker id -> last seen (monotonic), recent ones
        self._workers_pruned = time.monotonic()
        self._closed = False

    # -- the trainer's side -------------------------------------------------------------------
    def submit(self, specs: Iterable[tuple[Any, str, dict[str, Any]]]) -> list[Job]:
        """Queue one job per ``(task, mode, metadata)``; returns the jobs in order."""
        jobs = [Job(next(self._ids), task, mode, dict(meta or {})) for task, mode, meta in specs]
        with self._lock:
            self._pending.extend(jobs)
            self._changed.notify_all()
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)
        return jobs

    def wait(
        self,
        jobs: Sequence[Job],
        on_done: Callable[[Job], None] | None = None,
        poll: float = 0.1,
        log_every: float = 30.0,
    ) -> list[Job]:
        """Block until every job has its outcome, expiring leases and timing out attempts meanwhile."""
        reported: set[int] = set()
        last_log = time.monotonic()
        while True:
            self.reap()
            with self._lock:
                newly = [j for j in jobs if j.done and j.job_id not in reported]
                remaining = sum(not j.done for j in jobs)
                if not newly and remaining:
                    self._changed.wait(poll)
            for j in newly:
                reported.add(j.job_id)
                if on_done is not None:
                    on_done(j)
            if not remaining and len(reported) == len(jobs):
                return list(jobs)
            now = time.monotonic()
            if now - last_log > log_every:
                last_log = now
                stats = self.stats()
                logger.info(
                    "waiting for %d rollouts (%d queued, %d running, %d runner workers seen recently)",
                    remaining,
                    stats["queued"],
                    stats["running"],
                    stats["workers"],
                )

    def cancel(self, jobs: Sequence[Job], reason: str = "cancelled") -> None:
        """Give up on jobs not finished yet: queued ones leave the queue, running ones fail."""
        with self._lock:
            ids = {j.job_id for j in jobs if not j.done}
            self._pending = deque(j for j in self._pending if j.job_id not in ids)
            running = [a for a in self._attempts.values() if a.job.job_id in ids]
            for a in running:
                self._end(a, "expired")
            for j in jobs:
                if not j.done:
                    self._finish_job(j, "failed", None, reason)
        for a in running:
            self.store.finish_rollout(a.rollout_id, status="failed", error=reason, only_if_running=True)

    def reap(self, now: float | None = None) -> None:
        """Expire lapsed leases (retry or fail the job) and time out attempts past their deadline."""
        now = time.monotonic() if now is None else now
        expired: list[Attempt] = []
        timed_out: list[Attempt] = []
        with self._lock:
            for a in list(self._attempts.values()):
                if a.deadline is not None and now > a.deadline:
                    self._end(a, "timeout")
                    timed_out.append(a)
                    self._finish_job(
                        a.job, "timeout", None, f"TimeoutError: no result within {self.rollout_timeout} s"
                    )
                elif now > a.lease_expires:
                    self._end(a, "expired")
                    expired.append(a)
                    if a.job.attempts < self.max_attempts:
                        self._pending.appendleft(a.job)  # retried first
                    else:
                        self._finish_job(
                            a.job,
                            "failed",
                            None,
                            f"lease expired on {a.job.attempts} attempt(s): runner lost",
                        )
            if expired:
                waiters, self._waiters = self._waiters, set()
            else:
                waiters = set()
            if now - self._workers_pruned > self.lease_timeout:  # forget workers gone for long
                self._workers_pruned = now
                horizon = now - 3 * self.lease_timeout
                self._workers = {w: t for w, t in self._workers.items() if t >= horizon}
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)
        for a in timed_out:
            logger.warning("rollout %s (worker %s) timed out", a.rollout_id, a.worker)
            self.store.finish_rollout(a.rollout_id, status="timeout", error=a.job.error, only_if_running=True)
        for a in expired:
            logger.warning(
                "rollout %s: lease of worker %s expired (attempt %d of %d)",
                a.rollout_id,
                a.worker,
                a.job.attempts,
                self.max_attempts,
            )
            self.store.finish_rollout(
                a.rollout_id,
                status="failed",
                error=f"lease expired: worker {a.worker} stopped sending heartbeats",
                only_if_running=True,
            )

    # -- the runners' side --------------------------------------------------------------------
    def claim(self, worker: str, after: str | None = None) -> Attempt | None:
        """Take the next queued job for ``worker`` (a new attempt), or ``None`` when none is queued.

        ``after``: the rollout whose result asks for this claim; asked again after that result (a
        retried call) it answers the same attempt while it runs. ``None`` after :meth:`close`.
        """
        now = time.monotonic()
        with self._lock:
            self._workers[worker] = now
            prior = self._ended.get(after) if after is not None else None
            if prior is not None and prior.next_claim is not None:
                again = self._attempts.get(prior.next_claim)
                if again is not None and again.worker == worker:
                    return again
            if not self._pending or (after is not None and self._closed):
                return None
            job = self._pending.popleft()
            job.attempts += 1
            if job.started_at is None:
                job.started_at = now
        meta = {**job.metadata, "attempt": job.attempts, "worker": worker, "remote": True}
        try:
            ro = self.store.start_rollout(job.task, mode=job.mode, metadata=meta)
        except Exception:
            with self._lock:
                job.attempts -= 1
                self._pending.appendleft(job)
            raise
        deadline = None if self.rollout_timeout is None else now + self.rollout_timeout
        att = Attempt(
            ro.rollout_id, job, worker, int(self.version()), now, now + self.lease_timeout, deadline
        )
        with self._lock:
            self._attempts[ro.rollout_id] = att
            job.rollout_id = ro.rollout_id
            prior = self._ended.get(after) if after is not None else None
            if prior is not None and prior.state == "done":
                prior.next_claim = ro.rollout_id
        return att

    async def claim_async(self, worker: str, wait: float = 0.0) -> Attempt | None:
        """:meth:`claim`, waiting up to ``wait`` seconds (without a thread) for a job to be queued."""
        deadline = time.monotonic() + max(0.0, wait)
        loop = asyncio.get_running_loop()
        while not self._closed:
            att = await loop.run_in_executor(None, self.claim, worker) if self._pending else None
            if att is not None:
                return att
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            fut: asyncio.Future[None] = loop.create_future()
            entry = (loop, fut)
            with self._lock:
                if self._pending:
                    continue
                self._waiters.add(entry)
            try:
                await asyncio.wait_for(fut, timeout=min(remaining, 5.0))
            except asyncio.TimeoutError:
                pass
            finally:
                with self._lock:
                    self._waiters.discard(entry)
        return None

    def close(self) -> None:
        """Answer waiting and future claims with "nothing queued" (the trainer is stopping)."""
        with self._lock:
            self._closed = True
            waiters, self._waiters = self._waiters, set()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_wake, fut)

    def heartbeat(
        self, worker: str, rollout_ids: Iterable[str], leases: Collection[str] | None = None
    ) -> list[str]:
        """Renew the leases of ``rollout_ids``; returns those whose lease is lost (give them up).

        With ``leases`` (the tokens the request carries) a running attempt whose token is not
        among them raises :class:`LeaseMismatch`, and no lease is renewed.
        """
        now = time.monotonic()
        lost = []
        with self._lock:
            running = []
            for rid in rollout_ids:
                a = self._attempts.get(rid)
                if a is None:
                    lost.append(rid)
                elif not lease_ok(a.lease, leases):
                    raise LeaseMismatch(f"rollout {rid!r}: the heartbeat does not carry its lease")
                else:
                    running.append(a)
            self._workers[worker] = now
            for a in running:
                a.lease_expires = now + self.lease_timeout
        return lost

    def complete(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        leases: Collection[str] | None = None,
        rows: Sequence[SpanRow] | None = None,
    ) -> dict[str, Any]:
        """Record a runner's result. ``counted`` is true when it is the job's outcome.

        A result for an attempt given up already (lease expired, timed out) is recorded in the
        store as ``metadata["late_result"]`` (and its reward) without changing the outcome.
        Raises :class:`~agentlightning_lite.errors.UnknownRolloutError` (a ``KeyError``) for a
        rollout this queue does not know (never handed out, or ended longer ago than the last
        ``keep_ended`` attempts), :class:`LeaseMismatch` when ``leases`` lacks its token (nothing
        is recorded then).

        ``rows``: the attempt's last span rows (checked, all of ``rollout_id``), written after the
        lease check, before the outcome is counted; the answer says what became of them (``rows_outcome``).
        """
        if status not in _FINISHED:
            raise InvalidRequestError(f"status must be one of {_FINISHED}, got {status!r}")
        reward = check_reward(reward)
        accepted = 0
        if rows:
            with self._lock:
                a, _ = self._leased(rollout_id, leases, "result")
            if a is not None:  # running under this lease: the spans go in before the outcome
                self.store.add_span_rows(rows)
                accepted = len(rows)
        with self._lock:
            a, ended = self._leased(rollout_id, leases, "result")
            if a is not None:
                a.job.rollout_id = rollout_id
                self._finish_job(a.job, status, reward, error)
                self._end(a, "done")
                previous = "running"
            else:
                assert ended is not None
                previous = ended.state
        out: dict[str, Any]
        if previous == "running":
            self.store.finish_rollout(rollout_id, status=status, reward=reward, error=error)
            out = {"counted": True, "status": status}
        elif previous == "done":  # the runner retried a call whose answer it did not get
            assert ended is not None
            out = {"counted": True, "status": ended.status, "duplicate": True}
        else:
            self._record_late(rollout_id, status, reward, error, previous)
            out = {"counted": False, "status": previous, "reason": f"the attempt was given up ({previous})"}
        if rows is not None:
            out.update(rows_outcome(self.store, rollout_id, rows, accepted, previous == "done"))
        return out

    def _leased(
        self, rollout_id: str, leases: Collection[str] | None, what: str
    ) -> tuple[Attempt | None, EndedAttempt | None]:
        """The running attempt or the record of the ended one (exactly one is set), its lease checked.

        Call under the lock. Raises :class:`UnknownRolloutError` or :class:`LeaseMismatch`.
        """
        a = self._attempts.get(rollout_id)
        ended = None if a is not None else self._ended.get(rollout_id)
        holder = a if a is not None else ended
        if holder is None:
            raise UnknownRolloutError(rollout_id, _NOT_OURS.format(rollout_id))
        if not lease_ok(holder.lease, leases):
            raise LeaseMismatch(f"rollout {rollout_id!r}: the {what} does not carry its lease")
        return a, ended

    def set_reward(self, rollout_id: str, reward: float, leases: Collection[str] | None = None) -> None:
        """Record the reward of a running attempt (its result comes later).

        Raises :class:`OutcomeCounted` once the attempt ended (its outcome is counted: the stored
        reward is what training reads), :class:`LeaseMismatch` without its token,
        :class:`~agentlightning_lite.errors.UnknownRolloutError` for a rollout this queue does not know.
        """
        reward = check_reward(reward)  # type: ignore[assignment]
        with self._lock:
            _, ended = self._leased(rollout_id, leases, "reward")
            if ended is not None:
                raise OutcomeCounted(
                    f"rollout {rollout_id!r} ended ({ended.state}): its outcome is counted, "
                    "its reward cannot change"
                )
            # under the lock: a result counted meanwhile cannot be overwritten by this reward
            self.store.set_reward(rollout_id, reward)

    def check_writes(self, rollout_ids: Iterable[str], leases: Collection[str] | None) -> set[str]:
        """Check span writes into ``rollout_ids``; returns those that ended (their spans are dropped).

        Raises :class:`LeaseMismatch` when a running attempt's token is not in ``leases``.
        Rollouts this queue does not know are not its to check (and not in the answer).
        """
        ended = set()
        with self._lock:
            for rid in rollout_ids:
                a = self._attempts.get(rid)
                if a is not None:
                    if not lease_ok(a.lease, leases):
                        raise LeaseMismatch(f"rollout {rid!r}: the spans do not carry its lease")
                elif rid in self._ended:
                    ended.add(rid)
        return ended

    def check_call(self, rollout_id: str, leases: Collection[str] | None) -> None:
        """Check an LLM call routed to ``rollout_id``: a rollout this queue handed out (running, or
        ended recently) takes calls only with its claim's token in ``leases`` (:class:`LeaseMismatch`
        otherwise). Rollouts this queue does not know (in-process, trace) are not its to check.
        """
        with self._lock:
            a = self._attempts.get(rollout_id) or self._ended.get(rollout_id)
            if a is not None and not lease_ok(a.lease, leases):
                raise LeaseMismatch(f"rollout {rollout_id!r}: the LLM call does not carry its lease")

    def weights_version_of(self, rollout_id: str) -> int | None:
        """The weights version current when ``rollout_id`` was claimed (``None``: not from this queue)."""
        with self._lock:
            a = self._attempts.get(rollout_id) or self._ended.get(rollout_id)
        return None if a is None else a.weights_version

    def knows(self, rollout_id: str) -> bool:
        """Whether ``rollout_id`` is an attempt handed out by this queue (running, or ended recently)."""
        with self._lock:
            return rollout_id in self._attempts or rollout_id in self._ended

    def stats(self) -> dict[str, Any]:
        """Queued and running counts, recently seen workers, the weights version."""
        now = time.monotonic()
        with self._lock:
            running = len(self._attempts)
            workers = sum(1 for t in self._workers.values() if now - t < 3 * self.lease_timeout)
            queued = len(self._pending)
        return {
            "queued": queued,
            "running": running,
            "workers": workers,
            "weights_version": int(self.version()),
            "lease_timeout": self.lease_timeout,
        }

    # -- internals ----------------------------------------------------------------------------
    def _end(self, a: Attempt, state: str) -> None:
        """A running attempt ends: keep only a small record of it (caller holds the lock)."""
        a.state = state
        self._attempts.pop(a.rollout_id, None)
        if self.keep_ended:
            status = a.job.status if state == "done" else None
            self._ended[a.rollout_id] = EndedAttempt(a.lease, a.weights_version, state, status)
            while len(self._ended) > self.keep_ended:
                self._ended.popitem(last=False)

    def _finish_job(self, job: Job, status: str, reward: float | None, error: str | None) -> None:
        """Set the job's one outcome (caller holds the lock)."""
        if job.done:
            return
        job.status, job.reward, job.error = status, reward, error
        job.finished_at = time.monotonic()
        self._changed.notify_all()

    def _record_late(
        self, rollout_id: str, status: str, reward: float | None, error: str | None, why: str
    ) -> None:
        logger.warning("late result for rollout %s (%s): recorded, not trained on", rollout_id, why)
        ro = self.store.rollout_for_update(rollout_id)
        if ro is None:
            return
        late = {"status": status, "reward": reward, "error": error, "at": time.time(), "given_up": why}
        update: dict[str, Any] = {"metadata": {**ro.metadata, "late_result": late}}
        if ro.status == "running":  # should not happen: given-up attempts are finished in the store
            update.update(status="failed", end_time=time.time(), error=f"given up ({why})")
        self.store.update_rollout(ro.model_copy(update=update))


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)
