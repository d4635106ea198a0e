"""The rollout queue's scenarios over both stores: what the queue records (late results in
particular) is the same in a MemoryStore and in a SQLite file read by another process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import RolloutQueue


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[agl.Store]:
    s: agl.Store = agl.MemoryStore() if request.param == "memory" else agl.SQLiteStore(tmp_path / "runs.db")
    yield s
    s.close()


@pytest.fixture
def reread(store: agl.Store) -> Callable[[str], agl.Rollout]:
    """A rollout as a reader finds it: for a SQLite store, from another connection to the file."""

    def get(rollout_id: str) -> agl.Rollout:
        if isinstance(store, agl.SQLiteStore):
            store.flush()
            with agl.SQLiteStore(store.path) as other:
                ro = other.get_rollout(rollout_id)
        else:
            ro = store.get_rollout(rollout_id)
        assert ro is not None
        return ro

    return get


def test_a_lost_lease_late_result_is_kept_in_both_stores(
    store: agl.Store, reread: Callable[[str], agl.Rollout]
) -> None:
    q = RolloutQueue(store, lease_timeout=10.0, max_attempts=2)
    [job] = q.submit([("t", "train", {"step": 0})])
    a1 = q.claim("w1")
    assert a1 is not None
    q.reap(now=a1.lease_expires + 1)  # w1 went silent
    a2 = q.claim("w2")
    assert a2 is not None
    assert q.complete(a2.rollout_id, "succeeded", reward=0.5)["counted"] is True
    assert q.complete(a1.rollout_id, "succeeded", reward=1.0)["counted"] is False  # w1 comes back late
    first, second = reread(a1.rollout_id), reread(a2.rollout_id)
    assert first.status == "failed" and "lease expired" in (first.error or "")
    late = first.metadata["late_result"]
    assert (late["status"], late["reward"], late["given_up"]) == ("succeeded", 1.0, "expired")
    assert first.metadata["step"] == 0 and first.metadata["worker"] == "w1"  # the rest stays
    assert first.reward is None  # a late result is recorded, never the outcome
    assert (second.status, second.reward) == ("succeeded", 0.5) and "late_result" not in second.metadata
    assert (job.status, job.reward, job.rollout_id) == ("succeeded", 0.5, a2.rollout_id)


def test_a_timed_out_attempts_late_result_is_kept_in_both_stores(
    store: agl.Store, reread: Callable[[str], agl.Rollout]
) -> None:
    q = RolloutQueue(store, lease_timeout=10.0, rollout_timeout=1.0)
    [job] = q.submit([("t", "train", {})])
    a = q.claim("w1")
    assert a is not None
    q.reap(now=a.claimed_at + 2.0)
    assert job.status == "timeout"
    answer = q.complete(a.rollout_id, "failed", error="ValueError: bad", reward=None)
    assert answer["counted"] is False
    ro = reread(a.rollout_id)
    assert ro.status == "timeout" and ro.error is not None and "TimeoutError" in ro.error
    late = ro.metadata["late_result"]
    assert (late["status"], late["error"], late["given_up"]) == ("failed", "ValueError: bad", "timeout")
    assert job.reward is None


def test_outcomes_retries_and_cancel_read_the_same_from_both_stores(
    store: agl.Store, reread: Callable[[str], agl.Rollout]
) -> None:
    q = RolloutQueue(store, lease_timeout=10.0, max_attempts=3)
    jobs = q.submit([("a", "train", {}), ("b", "val", {}), ("c", "train", {})])
    a = q.claim("w1")
    b = q.claim("w2")
    c = q.claim("w3")
    assert a is not None and b is not None and c is not None
    assert q.complete(a.rollout_id, "succeeded", reward=1.0)["counted"] is True
    assert q.complete(a.rollout_id, "succeeded", reward=1.0).get("duplicate") is True
    q.reap(now=max(b.lease_expires, c.lease_expires) + 1)  # w2 and w3 went silent: both retried
    retried = {att.job.task: att for att in (q.claim("w4"), q.claim("w5")) if att is not None}
    b2, c2 = retried["b"], retried["c"]
    assert b2.rollout_id != b.rollout_id and b2.job is b.job
    q.cancel(jobs, "the trainer stopped")
    assert [j.status for j in jobs] == ["succeeded", "failed", "failed"]
    got = {att.rollout_id: reread(att.rollout_id) for att in (a, b, b2, c, c2)}
    assert (got[a.rollout_id].status, got[a.rollout_id].reward) == ("succeeded", 1.0)
    assert got[b.rollout_id].status == "failed" and got[b.rollout_id].mode == "val"
    assert "lease expired" in (got[c.rollout_id].error or "")
    for att in (b2, c2):
        assert (got[att.rollout_id].status, got[att.rollout_id].error) == ("failed", "the trainer stopped")
        assert got[att.rollout_id].metadata["attempt"] == 2
    assert sorted(r.status for r in store.rollouts()) == ["failed"] * 4 + ["succeeded"]
