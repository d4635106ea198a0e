"""The span-write rules every store follows alike: a span id belongs to one rollout, and nothing
starts in a rollout after it ended (a sync agent past its timeout writes nothing into it)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import main
from agentlightning_lite.rl.rollouts import RolloutSpec, run_rollouts


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[agl.Store]:
    s: agl.Store = agl.MemoryStore() if request.param == "memory" else agl.SQLiteStore(tmp_path / "runs.db")
    yield s
    s.close()


def _span(rid: str, sid: str, start: float, name: str = "search", output: object = None) -> agl.Span:
    return agl.Span(
        span_id=sid,
        rollout_id=rid,
        kind="tool",
        name=name,
        start_time=start,
        end_time=start + 0.01,
        output=output,
    )


def test_a_span_id_never_moves_to_another_rollout(store: agl.Store, caplog: pytest.LogCaptureFixture) -> None:
    a, b = store.start_rollout("a"), store.start_rollout("b")
    now = time.time()
    store.add_spans([_span(a.rollout_id, "s1", now, output="in a")])
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.store"):
        store.add_spans([_span(b.rollout_id, "s1", now, output="moved to b")])
        store.flush()
    assert [(s.span_id, s.output) for s in store.spans(a.rollout_id)] == [("s1", "in a")]
    assert store.spans(b.rollout_id) == []
    assert any(
        "would move a span to another rollout" in r.getMessage() and a.rollout_id in r.getMessage()
        for r in caplog.records
    )
    # the same span id for the same rollout replaces it, in place
    store.add_spans([_span(a.rollout_id, "s0", now - 1), _span(a.rollout_id, "s1", now, output="v2")])
    assert [(s.span_id, s.output) for s in store.spans(a.rollout_id)] == [("s0", None), ("s1", "v2")]


def test_a_span_id_written_for_two_rollouts_in_one_batch_stays_with_the_first(store: agl.Store) -> None:
    a, b = store.start_rollout("a"), store.start_rollout("b")
    now = time.time()
    store.add_spans([_span(a.rollout_id, "dup", now, output=1), _span(b.rollout_id, "dup", now, output=2)])
    assert [s.output for s in store.spans(a.rollout_id)] == [1]
    assert store.spans(b.rollout_id) == []


def test_spans_that_start_after_a_rollout_ended_are_dropped_earlier_ones_kept(
    store: agl.Store, caplog: pytest.LogCaptureFixture
) -> None:
    ro = store.start_rollout("t")
    during = time.time()
    time.sleep(0.01)
    done = store.finish_rollout(ro.rollout_id, status="timeout", error="too slow")
    assert done.end_time is not None and done.end_time > during
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.store"):
        # a span made while the rollout ran, flushed after its end (a batched span flush): kept
        store.add_spans([_span(ro.rollout_id, "early", during, name="llm call")])
        # one started after the end (an agent left running past its timeout): dropped
        store.add_spans([_span(ro.rollout_id, "late", done.end_time + 0.5, name="late call")])
        store.flush()
    assert [s.span_id for s in store.spans(ro.rollout_id)] == ["early"]
    assert any("started 0.500 s after the rollout ended (timeout)" in r.getMessage() for r in caplog.records)
    # a running rollout takes spans of any time
    running = store.start_rollout("u")
    store.add_spans([_span(running.rollout_id, "future", time.time() + 60)])
    assert [s.span_id for s in store.spans(running.rollout_id)] == ["future"]


def test_a_finish_and_a_late_span_queued_in_one_batch(tmp_path: Path) -> None:
    """SQLiteStore commits a batch at once: the finish still counts before the late span."""
    with agl.SQLiteStore(tmp_path / "runs.db", batch_size=10_000, flush_interval=0) as store:
        ro = store.start_rollout("t")
        store.add_spans([_span(ro.rollout_id, "during", time.time())])
        end = store.finish_rollout(ro.rollout_id, status="timeout").end_time
        assert end is not None
        store.add_spans([_span(ro.rollout_id, "after", end + 1.0)])
        store.flush()
        assert [s.span_id for s in store.spans(ro.rollout_id)] == ["during"]


def test_metadata_updates_are_kept_by_both_stores(store: agl.Store, tmp_path: Path) -> None:
    ro = store.start_rollout("t", metadata={"step": 3})
    store.finish_rollout(ro.rollout_id, status="timeout")
    current = store.get_rollout(ro.rollout_id)
    assert current is not None
    store.update_rollout(
        current.model_copy(update={"metadata": {**current.metadata, "late_result": {"r": 1}}})
    )
    assert store.get_rollout(ro.rollout_id).metadata["late_result"] == {"r": 1}  # type: ignore[union-attr]
    if isinstance(store, agl.SQLiteStore):  # and in the file, for another process
        store.flush()
        with agl.SQLiteStore(store.path) as other:
            got = other.get_rollout(ro.rollout_id)
            assert got is not None and got.metadata["late_result"] == {"r": 1} and got.metadata["step"] == 3


def test_metadata_update_of_a_rollout_started_in_the_same_batch(tmp_path: Path) -> None:
    with agl.SQLiteStore(tmp_path / "runs.db", batch_size=10_000, flush_interval=0) as store:
        ro = store.start_rollout("t")
        store.update_rollout(ro.model_copy(update={"metadata": {"k": "v"}, "status": "failed"}))
        store.flush()
        got = store.get_rollout(ro.rollout_id)
        assert got is not None and got.metadata == {"k": "v"} and got.status == "failed"


def test_a_thread_that_outlives_its_rollout_records_nothing_into_it(store: agl.Store) -> None:
    tracer = agl.Tracer(store)
    go, done = threading.Event(), threading.Event()

    def late() -> None:
        go.wait(5)
        agl.emit_reward(1.0)
        agl.emit_signal("still_here", value=1)
        with tracer.span("tool", "after_the_end"):
            pass
        done.set()

    import contextvars

    with tracer.rollout("t") as ro:
        agl.emit_reward(0.25)
        t = threading.Thread(target=contextvars.copy_context().run, args=(late,))
        t.start()
    go.set()
    assert done.wait(5)
    t.join()
    spans = store.spans(ro.id)
    assert [(s.kind, s.output) for s in spans] == [("reward", 0.25)]
    assert store.get_rollout(ro.id).reward == 0.25  # type: ignore[union-attr]


def test_a_sync_agent_past_its_timeout_writes_nothing_into_the_timeout_rollout(
    store: agl.Store, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real sync agent: it sleeps past its timeout, then emits a reward and returns one."""
    finished = threading.Event()

    def agent(task: object, llm: object) -> float:
        with agl.Tracer.current_rollout().tracer.span("tool", "before_the_deadline"):  # type: ignore[union-attr]
            pass
        time.sleep(1.0)
        agl.emit_reward(0.5, name="late_emit")
        with agl.Tracer.current_rollout().tracer.span("tool", "after_the_deadline"):  # type: ignore[union-attr]
            pass
        finished.set()
        return 1.0

    tracer = agl.Tracer(store)
    [res] = run_rollouts(agent, [RolloutSpec("t")], tracer, lambda rid: None, timeout=0.3)
    assert res.status == "timeout" and res.reward is None
    assert finished.wait(10)  # the agent thread ran to its end
    time.sleep(0.2)  # and its rollout handle closed
    ro = store.get_rollout(res.rollout_id)
    assert ro is not None and ro.status == "timeout" and ro.reward is None
    assert [(s.kind, s.name) for s in store.spans(res.rollout_id)] == [("tool", "before_the_deadline")]
    if isinstance(store, agl.SQLiteStore):  # what agl-lite show prints: no reward
        store.flush()
        capsys.readouterr()
        assert main(["show", str(store.path), res.rollout_id]) == 0
        out = capsys.readouterr().out
        assert "timeout" in out and "before_the_deadline" in out
        assert "reward" not in out.replace("reward -", "").replace("reward —", "")


def test_the_rules_hold_across_processes_sharing_a_sqlite_file(tmp_path: Path) -> None:
    """Two stores on one file (two processes): the rules are checked against what is committed."""
    with agl.SQLiteStore(tmp_path / "runs.db") as trainer, agl.SQLiteStore(tmp_path / "runs.db") as runner:
        a, b = trainer.start_rollout("a"), trainer.start_rollout("b")
        trainer.add_spans([_span(a.rollout_id, "s1", time.time())])
        end = trainer.finish_rollout(b.rollout_id, status="timeout").end_time
        trainer.flush()
        assert end is not None
        runner.add_spans([_span(b.rollout_id, "s1", end - 1.0), _span(b.rollout_id, "s2", end + 1.0)])
        runner.add_spans([_span(b.rollout_id, "s3", end - 1.0)])
        runner.flush()
        assert [s.span_id for s in trainer.spans(a.rollout_id)] == ["s1"]
        assert [s.span_id for s in trainer.spans(b.rollout_id)] == ["s3"]
