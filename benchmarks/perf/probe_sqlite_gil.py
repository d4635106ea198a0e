"""Why a SQLiteStore's writer thread does not run beside the agent: the GIL, measured.

Three measurements, CPU time against wall time (two threads that really run side by side use more CPU
seconds than wall seconds):

1. ``episodes``: ``bench_tracing``'s episodes into a MemoryStore and into SQLiteStores of several
   ``batch_size`` values: wall time, the process's CPU time, and the agent thread's own CPU time, per
   episode. Where the process's CPU equals the wall time, SQLite's writing never overlapped the agent.
2. ``statements``: 20,000 span rows written by ``write_spans`` (256-row statements) alone, then while
   another thread runs Python: each statement releases the GIL while SQLite works and must take it back
   from the busy thread, which hands it over only at its switch interval (``sys.getswitchinterval()``,
   5 ms by default).
3. ``one long statement``: a statement that runs long inside SQLite (a recursive CTE) beside the same busy
   thread: both run at once (SQLite does release the GIL), so what is lost in 2 is the handover.

    python -m benchmarks.perf.probe_sqlite_gil
"""

from __future__ import annotations

import gc
import os
import sqlite3
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import agentlightning_lite as agl
from agentlightning_lite.ids import new_rollout_id, new_span_id
from agentlightning_lite.store.rows import SpanRow
from agentlightning_lite.store.sqlite_batch import write_spans
from agentlightning_lite.store.sqlite_schema import SCHEMA, db_row_raw

from .bench_tracing import LOGPROBS, PROMPT_IDS, RESPONSE_IDS, agl_episode


def episodes(n: int = 3000) -> None:
    print("1. episodes (us per episode): wall, process CPU, the agent thread's CPU")
    for label, make in [("MemoryStore", lambda d: agl.MemoryStore())] + [
        (f"SQLiteStore batch_size={bs}", lambda d, bs=bs: agl.SQLiteStore(Path(d) / "p.db", batch_size=bs))
        for bs in (512, 2048, 8192)
    ]:
        store = make(tempfile.mkdtemp())
        tracer = agl.Tracer(store)
        for i in range(200):  # warm-up
            agl_episode(tracer, i)
        store.flush() if isinstance(store, agl.SQLiteStore) else None
        gc.collect()
        w0, p0, t0 = time.perf_counter(), time.process_time(), time.thread_time()
        for i in range(n):
            agl_episode(tracer, i)
        if isinstance(store, agl.SQLiteStore):
            store.flush()
        w, p, t = time.perf_counter() - w0, time.process_time() - p0, time.thread_time() - t0
        print(
            f"   {label}: wall {1e6 * w / n:.1f}, process CPU {1e6 * p / n:.1f}, "
            f"agent thread {1e6 * t / n:.1f}"
        )
        store.close()


def _busy(run: Callable[[], None]) -> tuple[float, float]:
    stop = False

    def spin() -> None:
        n = 0
        while not stop:
            n += 1

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.05)
    w0, p0 = time.perf_counter(), time.process_time()
    run()
    w, p = time.perf_counter() - w0, time.process_time() - p0
    stop = True
    th.join()
    return w, p


def statements(n: int = 20_000) -> None:
    conn = sqlite3.connect(Path(tempfile.mkdtemp()) / "s.db", check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.executescript(SCHEMA)
    prompt = '[{"role":"user","content":"What is 12 * 7 + 3? Use the calculator."}]'

    def rows() -> list[tuple[object, ...]]:
        rid = new_rollout_id()
        return [
            db_row_raw(
                SpanRow(new_span_id(), rid, None, "llm", "chat", "solver", time.time(), time.time(), "ok",
                        None, prompt, '"87"', "{}", "policy", PROMPT_IDS, RESPONSE_IDS, LOGPROBS)
            )
            for _ in range(n)
        ]  # fmt: skip

    def write(params: list[tuple[object, ...]]) -> Callable[[], None]:
        def run() -> None:
            conn.execute("BEGIN")
            write_spans(conn, params)
            conn.execute("COMMIT")

        return run

    params = rows()
    w0, p0 = time.perf_counter(), time.process_time()
    write(params)()
    w, p = time.perf_counter() - w0, time.process_time() - p0
    print(f"2. {n} span rows in 256-row statements, alone: wall {w:.2f} s, CPU {p:.2f} s")
    w, p = _busy(write(rows()))
    print(f"   the same beside a busy Python thread: wall {w:.2f} s, process CPU {p:.2f} s")
    query = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < 3000000) "
    query += "SELECT sum(i) FROM r"
    w0 = time.perf_counter()
    conn.execute(query).fetchone()
    alone = time.perf_counter() - w0
    w, p = _busy(lambda: conn.execute(query).fetchone() and None)
    print(
        f"3. one long statement: alone {alone:.2f} s; beside a busy thread wall {w:.2f} s, "
        f"process CPU {p:.2f} s"
    )
    conn.close()


def main() -> None:
    switch = sys.getswitchinterval() * 1000
    print(
        f"Python {sys.version.split()[0]}, SQLite {sqlite3.sqlite_version}, switch interval {switch:.0f} ms, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
    )
    episodes()
    statements()


if __name__ == "__main__":
    main()
