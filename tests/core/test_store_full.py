"""A SQLiteStore whose file cannot grow (a page limit; a process file-size limit): a clear error
naming the file, raised to the writer (not lost in the background flusher), and what was committed
before is kept in a valid file."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.store import StoreFullError

SRC = str(Path(agl.__file__).resolve().parents[1])


def episode(tracer: agl.Tracer, i: int, size: int) -> str:
    with tracer.rollout(f"task {i}") as ro:
        with tracer.span("llm", "chat") as sp:
            sp.set_output("x" * size)
        ro.reward(1.0)
    return ro.id


def check_kept(path: Path, ids: list[str], size: int) -> None:
    with sqlite3.connect(path) as c:
        assert c.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    with agl.SQLiteStore(path) as store:
        for rid in ids:
            ro = store.get_rollout(rid)
            assert ro is not None and ro.status == "succeeded" and ro.reward == 1.0
            assert [s.output for s in store.spans(rid) if s.kind == "llm"] == ["x" * size]
        episode(agl.Tracer(store), 999, 10)  # the file is still a working store


def test_page_limit_error_reaches_the_writer_and_committed_rollouts_survive(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = agl.SQLiteStore(path, flush_interval=0.02)  # partial batches go through the background flusher
    tracer = agl.Tracer(store)
    committed = [episode(tracer, i, 2000) for i in range(3)]
    store.flush()
    assert store._conn is not None
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages + 1}")

    with pytest.raises(StoreFullError) as info:
        for i in range(3, 200):  # only writes, no reads or flushes of our own: the flusher hits the limit
            episode(tracer, i, 20_000)
            time.sleep(0.01)
    msg = str(info.value)
    assert str(path) in msg and "the disk is full, or the file reached its size limit" in msg
    assert "what was committed before is kept" in msg and "kept in memory and retried" in msg
    assert isinstance(info.value, sqlite3.OperationalError)  # callers catching sqlite errors still do
    with pytest.raises(StoreFullError, match="kept in memory"):
        store.rollouts()  # a read flushes first: the same clear error, not "cannot rollback"
    n_before = len(committed)

    # space is freed: the kept writes go in with the next flush, and writing goes on
    store._conn.execute("PRAGMA max_page_count = 1000000")
    store.flush()
    late = episode(tracer, 500, 100)
    rollouts = store.rollouts()
    # the committed ones, the writes kept while the file was full (at least one rollout's), the late one
    assert rollouts[-1].rollout_id == late and len(rollouts) >= n_before + 2
    assert [r.rollout_id for r in rollouts[:n_before]] == committed
    # a write refused while full left no rollout failed or half-written (a refused finish leaves it running)
    assert {r.status for r in rollouts} <= {"succeeded", "running"}
    store.close()
    check_kept(path, committed, 2000)


def test_close_on_a_full_file_says_what_was_lost(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    store = agl.SQLiteStore(path, flush_interval=0)  # no background flusher: close() commits
    tracer = agl.Tracer(store)
    committed = [episode(tracer, i, 1000) for i in range(2)]
    store.flush()
    assert store._conn is not None
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    lost = [episode(tracer, i, 50_000) for i in range(2, 4)]
    with pytest.raises(StoreFullError, match=r"closing it lost 6 write\(s\) not committed") as info:
        store.close()
    assert str(path) in str(info.value)
    check_kept(path, committed, 1000)
    with agl.SQLiteStore(path) as reread:
        assert all(reread.get_rollout(rid) is None for rid in lost)  # all or nothing per batch


CHILD = """
import json, resource, signal, sys
import agentlightning_lite as agl
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing us
resource.setrlimit(resource.RLIMIT_FSIZE, (1024 * 1024, resource.RLIM_INFINITY))
store = agl.SQLiteStore(sys.argv[1], flush_interval=0.05)
tracer = agl.Tracer(store)
ok, error = [], None
for i in range(1000):
    try:
        with tracer.rollout(f"task {i}") as ro:
            with tracer.span("llm", "chat") as sp:
                sp.set_output("x" * 4000)
            ro.reward(1.0)
        if i % 4 == 3:
            store.flush()
            ok = [r.rollout_id for r in store.rollouts()]
    except agl.store.StoreFullError as exc:
        error = str(exc)
        break
try:
    store.close()
    closed = None
except agl.store.StoreFullError as exc:
    closed = str(exc)
print(json.dumps({"ok": ok, "error": error, "closed": closed}))
"""


@pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "darwin", reason="RLIMIT_FSIZE on Linux")
def test_file_size_limit_in_a_real_process(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["error"] is not None, "the size limit was never reached"
    assert out["error"].startswith(f"cannot write to {path}: ")
    assert "size limit" in out["error"] and "what was committed before is kept" in out["error"]
    assert out["closed"] is not None and "closing it lost" in out["closed"]
    assert len(out["ok"]) >= 8
    check_kept(path, out["ok"], 4000)
