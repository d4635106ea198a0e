"""Rollouts left ``running`` by a process killed with SIGKILL: found, shown by ``agl-lite runs``, and
marked ``failed`` ("interrupted") by ``agl-lite recover`` (a real SQLite file, a real killed process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import main
from agentlightning_lite.store.recovery import OWNER_KEY, owner, recover_interrupted, stale_running

SRC = str(Path(agl.__file__).resolve().parents[1])

CHILD = """
import sys, time
import agentlightning_lite as agl
store = agl.SQLiteStore(sys.argv[1], flush_interval=0.05)
tracer = agl.Tracer(store)
with tracer.rollout("finished", mode="train") as ro:
    ro.reward(1.0)
first = tracer.rollout("task 0", mode="train").__enter__()  # never left: the process dies in it
with tracer.span("llm", "chat") as sp:
    sp.set_output("half-way")
running = [store.get_rollout(first.id), store.start_rollout("task 1", mode="train")]
store.flush()
print(" ".join(r.rollout_id for r in running), flush=True)
time.sleep(600)
"""


def killed_writer(db: Path) -> list[str]:
    """Run a process that starts rollouts in ``db``, then SIGKILL it; the ids it left running."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(db)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "the writer process died before starting its rollouts"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    assert proc.returncode == -signal.SIGKILL
    return line.split()


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_rollouts_record_their_owner_process(tmp_path: Path) -> None:
    with agl.SQLiteStore(tmp_path / "runs.db") as store:
        ro = store.start_rollout("q", metadata={"step": 3})
        assert store.get_rollout(ro.rollout_id).metadata == {"step": 3, OWNER_KEY: owner()}  # type: ignore[union-attr]
        assert owner()["pid"] == os.getpid()
        given = {"pid": 1, "host": "elsewhere"}
        other = store.start_rollout("q", metadata={OWNER_KEY: given})
        assert store.get_rollout(other.rollout_id).metadata[OWNER_KEY] == given  # type: ignore[union-attr]


def test_killed_process_rollouts_shown_and_recovered_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    left = killed_writer(db)
    store = agl.SQLiteStore(db)
    mine = store.start_rollout("still mine")  # running, owned by this live process
    foreign = store.start_rollout("elsewhere", metadata={OWNER_KEY: {"pid": 1, "host": "another-host"}})
    store.close()

    code, out, _ = run_cli(capsys, "runs", str(db), "--json")
    items = {i["rollout_id"]: i for i in json.loads(out)}
    assert code == 0 and len(items) == 5
    assert {rid for rid, i in items.items() if i["process_gone"]} == set(left)
    assert all(items[rid]["status"] == "running" for rid in left)
    assert not items[mine.rollout_id]["process_gone"] and not items[foreign.rollout_id]["process_gone"]

    code, out, _ = run_cli(capsys, "runs", str(db), "--plain")
    rows = {
        line.split()[0]: line.split()[1]
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in items
    }
    assert [rows[rid] for rid in left] == ["running?", "running?"]
    assert rows[mine.rollout_id] == "running" and rows[foreign.rollout_id] == "running"
    assert f"2 running? = left running by a process that is gone; `agl-lite recover {db}`" in out

    code, out, _ = run_cli(capsys, "recover", str(db), "--dry-run", "--json")
    assert code == 0 and sorted(r["rollout_id"] for r in json.loads(out)) == sorted(left)
    assert all(r.status == "running" for r in agl.SQLiteStore(db).rollouts() if r.rollout_id in left)

    code, out, _ = run_cli(capsys, "recover", str(db), "--plain")
    assert code == 0 and "marked 2 rollout(s) failed (interrupted)" in out
    with agl.SQLiteStore(db) as reread:
        by_id = {r.rollout_id: r for r in reread.rollouts()}
        assert [(by_id[rid].status, by_id[rid].error) for rid in left] == [("failed", "interrupted")] * 2
        assert all(by_id[rid].end_time is not None for rid in left)
        assert [s.output for s in reread.spans(left[0])] == ["half-way"]  # what it committed is kept
        assert by_id[mine.rollout_id].status == "running" and by_id[foreign.rollout_id].status == "running"
        assert [r.status for r in by_id.values()].count("succeeded") == 1

    code, out, _ = run_cli(capsys, "runs", str(db), "--plain")
    rows = {
        line.split()[0]: line.split()[1:3]
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in items
    }
    assert [rows[rid] for rid in left] == [["failed", "(interrupted)"]] * 2
    assert "running?" not in out

    code, out, _ = run_cli(capsys, "recover", str(db))
    assert code == 0 and "no interrupted rollouts" in out
    # a rollout whose process cannot be checked from here is marked only by age
    code, out, _ = run_cli(capsys, "recover", str(db), "--older-than", "3600", "--json")
    assert json.loads(out) == []
    time.sleep(0.05)
    code, out, _ = run_cli(capsys, "recover", str(db), "--older-than", "0.01", "--json")
    assert [r["rollout_id"] for r in json.loads(out)] == [foreign.rollout_id]
    with agl.SQLiteStore(db) as reread:
        assert reread.get_rollout(mine.rollout_id).status == "running"  # type: ignore[union-attr]


def test_recover_usage_errors_never_create_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.db"
    code, _, err = run_cli(capsys, "recover", str(missing))
    assert code == 2 and "no such file" in err and not missing.exists()
    foreign = tmp_path / "foreign.db"
    import sqlite3

    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE t (x)")
    code, _, err = run_cli(capsys, "recover", str(foreign))
    assert code == 2 and "not an agentlightning-lite store" in err
    with agl.SQLiteStore(tmp_path / "runs.db"):
        pass
    code, _, err = run_cli(capsys, "recover", str(tmp_path / "runs.db"), "--older-than", "-1")
    assert code == 2 and "--older-than" in err


def test_stale_running_rules(store: agl.Store) -> None:
    host = owner()["host"]
    dead = store.start_rollout("dead", metadata={OWNER_KEY: {"pid": 0, "host": host}})
    alive = store.start_rollout("alive")
    legacy = store.start_rollout("legacy", metadata={OWNER_KEY: "not a dict"})
    done = store.start_rollout("done", metadata={OWNER_KEY: {"pid": 0, "host": host}})
    store.finish_rollout(done.rollout_id, reward=1.0)
    running = store.rollouts()
    assert [r.rollout_id for r in stale_running(running)] == [dead.rollout_id]
    later = time.time() + 10
    assert {r.rollout_id for r in stale_running(running, older_than=5, now=later)} == {
        dead.rollout_id,
        legacy.rollout_id,
    }
    assert [r.rollout_id for r in recover_interrupted(store)] == [dead.rollout_id]
    assert store.get_rollout(alive.rollout_id).status == "running"  # type: ignore[union-attr]
    assert store.get_rollout(done.rollout_id).status == "succeeded"  # type: ignore[union-attr]
