"""The rollout queue alone: leases, retries, attempts, timeouts, late results, one outcome per rollout."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterable

import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import RolloutQueue
from agentlightning_lite.remote.queue import LeaseMismatch, OutcomeCounted
from agentlightning_lite.store.base import Store


def make(**kw: object) -> tuple[agl.MemoryStore, RolloutQueue]:
    store = agl.MemoryStore()
    kw.setdefault("lease_timeout", 10.0)
    return store, RolloutQueue(store, **kw)  # type: ignore[arg-type]


def test_lost_lease_is_retried_then_failed_after_max_attempts() -> None:
    store, q = make(max_attempts=2)
    [job] = q.submit([("t", "train", {"step": 0})])
    a1 = q.claim("w1")
    assert a1 is not None and q.claim("w2") is None  # one job, one claim
    q.reap(now=a1.lease_expires + 1)  # w1 died: its lease ran out
    assert not job.done and store.get_rollout(a1.rollout_id).status == "failed"
    a2 = q.claim("w2")
    assert a2 is not None and a2.job is job and a2.rollout_id != a1.rollout_id
    q.reap(now=a2.lease_expires + 1)
    assert job.status == "failed" and "lease expired" in (job.error or "")
    assert q.claim("w3") is None  # no third attempt
    # the first runner comes back late: recorded, not counted
    answer = q.complete(a1.rollout_id, "succeeded", reward=1.0)
    assert answer["counted"] is False and job.status == "failed"
    assert store.get_rollout(a1.rollout_id).metadata["late_result"]["reward"] == 1.0


def test_heartbeats_keep_a_lease_and_a_retry_counts_once() -> None:
    store, q = make(max_attempts=3)
    [job] = q.submit([("t", "train", {})])
    a1 = q.claim("w1")
    assert a1 is not None
    assert q.heartbeat("w1", [a1.rollout_id]) == []
    q.reap(now=a1.claimed_at + 5)  # within the renewed lease
    assert a1.state == "running"
    q.reap(now=a1.lease_expires + 1)
    a2 = q.claim("w2")
    assert a2 is not None
    assert q.heartbeat("w1", [a1.rollout_id]) == [a1.rollout_id]  # w1 learns its lease is gone
    assert q.complete(a2.rollout_id, "succeeded", reward=0.5)["counted"] is True
    assert q.complete(a2.rollout_id, "succeeded", reward=0.5)["duplicate"] is True  # a retried call
    assert q.complete(a1.rollout_id, "succeeded", reward=1.0)["counted"] is False
    assert (job.status, job.reward, job.rollout_id, job.attempts) == ("succeeded", 0.5, a2.rollout_id, 2)
    assert q.wait([job]) == [job]
    statuses = sorted(r.status for r in store.rollouts())
    assert statuses == ["failed", "succeeded"]  # both attempts are in the store, one counted


def test_a_slow_attempt_times_out_and_its_late_result_is_not_the_outcome() -> None:
    store, q = make(rollout_timeout=1.0)
    [job] = q.submit([("t", "train", {})])
    a = q.claim("w1")
    assert a is not None and a.public()["timeout"] == 1.0
    q.heartbeat("w1", [a.rollout_id])
    q.reap(now=a.claimed_at + 2.0)
    assert job.status == "timeout" and store.get_rollout(a.rollout_id).status == "timeout"
    answer = q.complete(a.rollout_id, "succeeded", reward=1.0)
    assert answer["counted"] is False
    ro = store.get_rollout(a.rollout_id)
    assert ro.status == "timeout" and ro.metadata["late_result"]["status"] == "succeeded"
    assert job.reward is None


def test_bad_results_are_refused() -> None:
    _, q = make()
    q.submit([("t", "train", {})])
    a = q.claim("w")
    assert a is not None
    with pytest.raises(ValueError):
        q.complete(a.rollout_id, "running")
    with pytest.raises(ValueError):
        q.complete(a.rollout_id, "succeeded", reward=float("nan"))
    with pytest.raises(KeyError):
        q.complete("nope", "succeeded")


def test_cancel_fails_what_is_left() -> None:
    store, q = make()
    jobs = q.submit([("a", "train", {}), ("b", "train", {})])
    a = q.claim("w")
    assert a is not None
    q.cancel(jobs, "stopped")
    assert [j.status for j in jobs] == ["failed", "failed"]
    assert store.get_rollout(a.rollout_id).status == "failed" and q.claim("w") is None


def test_queue_calls_with_leases_need_the_claims_token() -> None:
    store, q = make(rollout_timeout=5.0)
    [job] = q.submit([("t", "train", {})])
    a = q.claim("w")
    assert a is not None and a.public()["lease"] == a.lease
    expires = a.lease_expires
    for call in (
        lambda: q.heartbeat("x", [a.rollout_id], leases=["nope"]),
        lambda: q.complete(a.rollout_id, "succeeded", 1.0, leases=[]),
        lambda: q.set_reward(a.rollout_id, 1.0, leases=["nope"]),
        lambda: q.check_writes([a.rollout_id], leases=["nope"]),
    ):
        with pytest.raises(LeaseMismatch):
            call()
    assert (a.lease_expires, job.done, store.get_rollout(a.rollout_id).reward) == (expires, False, None)
    q.set_reward(a.rollout_id, 0.5, leases=[a.lease])
    assert q.complete(a.rollout_id, "succeeded", leases=["other", a.lease])["counted"] is True
    with pytest.raises(OutcomeCounted):
        q.set_reward(a.rollout_id, 1.0, leases=[a.lease])
    assert store.get_rollout(a.rollout_id).reward == 0.5 and q.check_writes([a.rollout_id], None) == {
        a.rollout_id
    }


class _KeepsNothing(Store):
    """A store that keeps nothing: what the process holds after many rollouts is the queue's own."""

    def insert_rollout(self, rollout: agl.Rollout) -> None:
        pass

    def update_rollout(self, rollout: agl.Rollout) -> None:
        pass

    def rollout_for_update(self, rollout_id: str) -> agl.Rollout:
        return agl.Rollout(rollout_id=rollout_id, start_time=0.0)

    def get_rollout(self, rollout_id: str) -> agl.Rollout | None:
        return None

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[agl.Rollout]:
        return []

    def add_spans(self, spans: Iterable[agl.Span]) -> None:
        pass

    def spans(self, rollout_id: str) -> list[agl.Span]:
        return []


@pytest.mark.slow
def test_memory_stays_flat_over_tens_of_thousands_of_rollouts() -> None:
    """20,000 rollouts after the first 12,000 (past the 10,000 ended ones the queue keeps), the queue holds
    less than 256 KiB more: 13 bytes a rollout, the bound 1 MiB over 80,000 gave (measured: 296 bytes
    more in all; the queue used to keep about 0.7 KiB per rollout for good)."""
    q = RolloutQueue(_KeepsNothing(), lease_timeout=30.0, rollout_timeout=60.0)
    held = {}
    done = 0
    tracemalloc.start()
    try:
        for mark in (12_000, 32_000):
            while done < mark:
                jobs = q.submit([({"q": "2+2?", "context": "x" * 200}, "train", {"step": done})] * 1000)
                for _ in jobs:
                    a = q.claim("w")
                    assert a is not None
                    assert q.complete(a.rollout_id, "succeeded", 1.0)["counted"]
                assert [j.status for j in q.wait(jobs)] == ["succeeded"] * 1000
                done += len(jobs)
            del jobs, a
            gc.collect()
            held[mark] = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    growth = held[32_000] - held[12_000]  # 20,000 rollouts later (it was about 1 KiB each)
    print({f"after {k:,} rollouts": f"{v / 2**20:.1f} MiB traced" for k, v in held.items()})
    assert growth < 2**18, f"{growth / 2**10:.1f} KiB more after 20,000 more rollouts"
    assert len(q._attempts) == 0 and len(q._ended) == q.keep_ended == 10_000


def test_workers_gone_for_long_are_forgotten() -> None:
    _, q = make(lease_timeout=1.0)
    for i in range(50):
        assert q.claim(f"gone-{i}") is None  # nothing queued: the worker is seen all the same
    assert q.stats()["workers"] == 50
    q.reap(now=q._workers["gone-0"] + 10.0)
    assert q.stats()["workers"] == 0 and q._workers == {}
