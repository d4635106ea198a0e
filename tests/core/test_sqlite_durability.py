"""SQLiteStore across processes: reopen, concurrent writers, SIGKILL mid-stream, foreign files."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.store.sqlite import NotOurDatabase


def _python(code: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


WRITE_AGENT_RUNS = """
    import sys
    import agentlightning_lite as agl
    store = agl.SQLiteStore(sys.argv[1])
    tracer = agl.Tracer(store)
    for i in range(3):
        with tracer.rollout({"q": i}, mode="train") as ro:
            with tracer.span("agent", "solver", agent="solver"):
                with tracer.span("llm", "chat", input=[{"role": "user", "content": f"q{i}"}]) as sp:
                    sp.set_output(f"a{i}")
                    sp.set_tokens([1, 2, i], [7, i], [-0.5, -0.25])
                with tracer.span("tool", "calc", input=i):
                    pass
            ro.reward(i / 2)
    print(",".join(r.rollout_id for r in store.rollouts()))
"""  # the process exits without close(): the at-exit flush must keep everything


def test_reopen_in_new_process_reads_same_data(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    p = _python(WRITE_AGENT_RUNS, str(db))
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    ids = out.strip().split(",")
    reader = _python(
        """
        import sys, json
        import agentlightning_lite as agl
        store = agl.SQLiteStore(sys.argv[1])
        print(json.dumps([
            {"reward": r.reward, "status": r.status, "task": r.task,
             "spans": [[s.kind, s.name, s.agent, s.prompt_token_ids, s.response_token_ids,
                        s.response_logprobs, s.output] for s in store.spans(r.rollout_id)],
             "transitions": [t.reward for t in agl.transitions(store, rollout_ids=[r.rollout_id])]}
            for r in store.rollouts()
        ]))
        """,
        str(db),
    )
    out2, err2 = reader.communicate(timeout=60)
    assert reader.returncode == 0, err2
    import json

    got = json.loads(out2)
    assert [g["reward"] for g in got] == [0.0, 0.5, 1.0]
    assert [g["task"] for g in got] == [{"q": 0}, {"q": 1}, {"q": 2}]
    assert all(g["status"] == "succeeded" for g in got)
    assert got[2]["spans"][:3] == [
        ["agent", "solver", "solver", None, None, None, None],
        ["llm", "chat", "solver", [1, 2, 2], [7, 2], [-0.5, -0.25], "a2"],
        ["tool", "calc", "solver", None, None, None, None],
    ]
    assert [g["transitions"] for g in got] == [[0.0], [0.5], [1.0]]
    with agl.SQLiteStore(db) as store:
        assert [r.rollout_id for r in store.rollouts()] == ids


CONCURRENT_WRITER = """
    import sys
    import agentlightning_lite as agl
    store = agl.SQLiteStore(sys.argv[1], batch_size=16, flush_interval=0.01)
    tracer = agl.Tracer(store)
    w = int(sys.argv[2])
    for i in range(5):
        with tracer.rollout({"writer": w, "i": i}) as ro:
            for j in range(200):
                with tracer.span("llm", f"w{w}-{i}-{j}"):
                    pass
            ro.reward(float(w))
    store.close()
"""


@pytest.mark.slow
def test_several_processes_write_one_file(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    agl.SQLiteStore(db).close()  # create the schema first, as a trainer would
    procs = [_python(CONCURRENT_WRITER, str(db), str(w)) for w in range(4)]
    with agl.SQLiteStore(db) as reader:  # a reader polls while they write: WAL never blocks it
        while any(p.poll() is None for p in procs):
            reader.rollouts()
            time.sleep(0.05)
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    with agl.SQLiteStore(db) as store:
        rollouts = store.rollouts()
        assert len(rollouts) == 20
        assert all(r.status == "succeeded" for r in rollouts)
        for r in rollouts:
            w, i = r.task["writer"], r.task["i"]
            assert r.reward == float(w)
            names = [s.name for s in store.spans(r.rollout_id) if s.kind == "llm"]
            assert names == [f"w{w}-{i}-{j}" for j in range(200)]
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM spans WHERE kind = ?", ("llm",)).fetchone()[0] == 4000


KILLED_WRITER = """
    import sys
    import agentlightning_lite as agl
    batch = int(sys.argv[2])
    store = agl.SQLiteStore(sys.argv[1], batch_size=batch, flush_interval=0)
    ro = store.start_rollout("stream", mode="train")
    print("rollout", ro.rollout_id, flush=True)
    n = 0
    while True:
        spans = [agl.Span(span_id=f"{n + k:012d}", rollout_id=ro.rollout_id, kind="llm", name="x" * 200,
                          start_time=float(n + k), input={"payload": "y" * 500},
                          prompt_token_ids=list(range(64)))
                 for k in range(batch)]
        store.add_spans(spans)  # reaches batch_size: commits before returning
        n += batch
        print("committed", n, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", [3, 40])
def test_sigkill_mid_stream_leaves_valid_file(tmp_path: Path, kill_after: int) -> None:
    db = tmp_path / "killed.db"
    batch = 50
    p = _python(KILLED_WRITER, str(db), str(batch))
    assert p.stdout is not None
    rollout_id = p.stdout.readline().split()[1]
    committed = 0
    for _ in range(kill_after):
        committed = int(p.stdout.readline().split()[1])
    os.kill(p.pid, signal.SIGKILL)  # while it is serialising or writing the next batch
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    with agl.SQLiteStore(db) as store:
        spans = store.spans(rollout_id)
        assert len(spans) >= committed  # every batch reported committed is there
        assert len(spans) % batch == 0  # and only whole batches: a batch is one transaction
        assert [s.span_id for s in spans] == [f"{k:012d}" for k in range(len(spans))]
        assert spans[-1].prompt_token_ids == list(range(64))
        assert store.get_rollout(rollout_id).status == "running"
        store.finish_rollout(rollout_id, status="failed", error="writer killed")  # still writable
        assert store.get_rollout(rollout_id).status == "failed"


def test_foreign_files_get_clear_errors(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    with pytest.raises(NotOurDatabase, match="not an agentlightning-lite store"):
        agl.SQLiteStore(other)
    text = tmp_path / "notes.db"
    text.write_text("hello, this is not sqlite" * 100)
    with pytest.raises(NotOurDatabase, match="not a SQLite database"):
        agl.SQLiteStore(text)


def test_batched_writes_visible_to_other_connection_after_interval(tmp_path: Path) -> None:
    db = tmp_path / "b.db"
    with agl.SQLiteStore(db, batch_size=1000, flush_interval=0.05) as store:
        ro = store.start_rollout("t")
        store.add_spans([agl.Span(span_id="s1", rollout_id=ro.rollout_id, start_time=0.0)])
        other = agl.SQLiteStore(db, flush_interval=0)
        deadline = time.time() + 5
        while not other.spans(ro.rollout_id) and time.time() < deadline:
            time.sleep(0.02)
        assert [s.span_id for s in other.spans(ro.rollout_id)] == ["s1"]  # the background flush
        other.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.spans(ro.rollout_id)


def _child_writes(store: agl.SQLiteStore, n: int) -> None:
    tracer = agl.Tracer(store)
    for i in range(n):
        with tracer.rollout({"child": i}) as ro:
            with tracer.span("llm", "chat"):
                pass
            ro.reward(1.0)
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_children_reuse_the_store_object(tmp_path: Path) -> None:
    import multiprocessing as mp

    store = agl.SQLiteStore(tmp_path / "fork.db", batch_size=1000, flush_interval=0)
    with agl.Tracer(store).rollout("parent") as parent:
        pass  # still pending in the parent's queue when the children fork
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_child_writes, args=(store, 5)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rollouts = store.rollouts()  # the parent's connection still works after the children closed theirs
    assert len(rollouts) == 16
    assert sum(1 for r in rollouts if r.task == "parent") == 1  # the children did not write it again
    assert store.get_rollout(parent.id).status == "succeeded"
    assert sum(len(store.spans(r.rollout_id)) for r in rollouts) == 15 * 2
    store.close()
