"""Where an episode's time goes in the embedded tracer, against the OpenTelemetry SDK in the same process.

Runs ``bench_tracing``'s episode (a rollout, an agent span, two LLM calls with token ids, a tool
call, a reward: 5 spans) with parts of the tracer's work taken away in turn, and prints the CPU time
of this thread per episode for each (medians of the repeats; CPU time, so that other load on the
machine counts less than in wall time):

- ``full``: the tracer into a MemoryStore, as in the benchmark;
- ``full, no cyclic GC``: the same with ``gc`` disabled (what the collector's passes over the rows the
  store keeps cost);
- ``no store``: the same with ``add_span_rows`` a no-op (the store's bookkeeping taken away);
- ``no store, no JSON``: also without encoding the payloads (the defensive copy taken away);
- ``rollout only``: ``with tracer.rollout(...)`` and nothing inside;
- the OTel SDK's episode (SimpleSpanProcessor, in-memory exporter).

Then, per span row of those episodes: what SQLite's insert costs on its own (the row's SQL parameters,
the store's schema and upsert in its multi-row statements, and a plain insert into the table without its
indexes), and what a row costs on its way through the remote path (``RemoteStore`` ->
``/agl/v1/spans``: the client's JSON encoding, the server's decoding and ``check_row``).

    python -m benchmarks.perf.profile_tracing --episodes 3000 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite import span_handles
from agentlightning_lite.store.rows import SpanRow
from agentlightning_lite.store.sqlite_batch import write_spans
from agentlightning_lite.store.sqlite_schema import SCHEMA, SPAN_COLUMNS, SPAN_UPSERT, db_row_raw

from .bench_tracing import SPANS_PER_EPISODE, agl_episode, otel_runner


class _NoWrites(agl.MemoryStore):
    def add_span_rows(self, rows: Sequence[Any]) -> None:
        pass


def _cpu_per_episode(episode: Callable[[int], None], n: int) -> float:
    gc.collect()
    t0 = time.thread_time()
    for i in range(n):
        episode(i)
    return (time.thread_time() - t0) / n * 1e6


def _rollout_only(tracer: agl.Tracer, i: int) -> None:
    with tracer.rollout({"i": i}, mode="train"):
        pass


class _Rows(agl.MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[SpanRow] = []

    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        self.rows.extend(rows)


def _per_row(fn: Callable[[], Any], n: int) -> float:
    gc.collect()
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) / n * 1e6


def _sqlite_insert(rows: list[SpanRow], with_indexes: bool) -> float:
    """CPU us a row to write ``rows`` into a fresh file with the store's settings, 512 rows a transaction."""
    conn = sqlite3.connect(os.path.join(tempfile.mkdtemp(), "rows.db"), isolation_level=None)
    for pragma in ("page_size = 16384", "journal_mode = WAL", "synchronous = NORMAL", "cache_size = -16384"):
        conn.execute(f"PRAGMA {pragma}")
    schema, sql = SCHEMA, SPAN_UPSERT
    if not with_indexes:
        schema = schema.replace("TEXT NOT NULL UNIQUE", "TEXT NOT NULL").split(
            "CREATE INDEX IF NOT EXISTS spans_"
        )[0]
        sql = f"INSERT INTO spans ({SPAN_COLUMNS}) VALUES ({', '.join('?' * 17)})"
    conn.executescript(schema)
    params = [db_row_raw(r) for r in rows]

    def write() -> None:
        for i in range(0, len(params), 512):
            conn.execute("BEGIN IMMEDIATE")
            if with_indexes:  # as the store writes them: multi-row statements
                write_spans(conn, params[i : i + 512])
            else:
                conn.executemany(sql, params[i : i + 512])
            conn.execute("COMMIT")

    try:
        return _per_row(write, len(rows))
    finally:
        conn.close()


def _row_costs(n: int) -> None:
    from agentlightning_lite.remote.routes import check_row

    capture = _Rows()
    tracer = agl.Tracer(capture)
    for i in range(n):
        agl_episode(tracer, i)
    rows = capture.rows
    print(f"\nper span row ({len(rows)} rows of these episodes), CPU us:")
    params = _per_row(lambda: [db_row_raw(r) for r in rows], len(rows))
    print(f"- the row's SQL parameters (db_row_raw: token blobs): {params:.2f}")
    print(f"- SQLite, the store's schema and upsert: {_sqlite_insert(rows, True):.2f}")
    print(f"- SQLite, plain insert, no indexes: {_sqlite_insert(rows, False):.2f}")
    wire = [list(r) for r in rows]
    body = b""

    def encode() -> None:
        nonlocal body
        body = json.dumps({"rows": wire}).encode()

    enc = _per_row(encode, len(rows))
    decoded: dict[str, Any] = {}

    def decode() -> None:
        decoded.update(json.loads(body))

    dec = _per_row(decode, len(rows))
    chk = _per_row(lambda: [check_row(r, 3) for r in decoded["rows"]], len(rows))
    print(
        f"- remote ({len(body) / len(rows):.0f} bytes a row on the wire): client json.dumps {enc:.2f}, "
        f"server json.loads {dec:.2f}, check_row {chk:.2f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    n = args.episodes
    cols: dict[str, list[float]] = {}
    real_dumps = span_handles.dumps
    for _ in range(args.repeats):
        full = agl.Tracer(agl.MemoryStore())
        cols.setdefault("full", []).append(_cpu_per_episode(functools.partial(agl_episode, full), n))
        gc.disable()
        try:
            no_gc = _cpu_per_episode(functools.partial(agl_episode, agl.Tracer(agl.MemoryStore())), n)
        finally:
            gc.enable()
        cols.setdefault("full, no cyclic GC", []).append(no_gc)
        bare = agl.Tracer(_NoWrites())
        cols.setdefault("no store", []).append(_cpu_per_episode(functools.partial(agl_episode, bare), n))
        span_handles.dumps = lambda value: "null"  # type: ignore[assignment]
        try:
            no_json = _cpu_per_episode(functools.partial(agl_episode, bare), n)
        finally:
            span_handles.dumps = real_dumps
        cols.setdefault("no store, no JSON", []).append(no_json)
        rollout_only = _cpu_per_episode(functools.partial(_rollout_only, full), n)
        cols.setdefault("rollout only", []).append(rollout_only)
        episode, _count, shutdown = otel_runner(batch=False)
        cols.setdefault("OTel SDK", []).append(_cpu_per_episode(episode, n))
        shutdown()
    med = {k: statistics.median(v) for k, v in cols.items()}
    otel = med["OTel SDK"]
    print(f"load average after the episodes: {os.getloadavg()[0]:.2f} (1 min)")
    print("| run | CPU us / episode (median) | us / span | OTel SDK / this |")
    print("|---|---:|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.1f} | {v / SPANS_PER_EPISODE:.1f} | {otel / v:.2f} |")
    parts = {
        "store bookkeeping (add_span_rows)": med["full"] - med["no store"],
        "payload JSON encoding (the defensive copy)": med["no store"] - med["no store, no JSON"],
        "rollout open/close": med["rollout only"],
        "span handles, contexts, rows (the rest)": med["no store, no JSON"] - med["rollout only"],
    }
    print("\n| part of the tracer's episode | CPU us | share |")
    print("|---|---:|---:|")
    for k, v in parts.items():
        print(f"| {k} | {v:.1f} | {v / med['full']:.0%} |")
    gc_cost = med["full"] - med["full, no cyclic GC"]
    print(f"\nof which the cyclic GC's passes (full - full, no cyclic GC): {gc_cost:.1f} us")
    need = otel / 10
    print(f"\nfor 10x the OTel SDK an episode would have to take {need:.1f} us; it takes {med['full']:.1f}")
    _row_costs(min(n, 4000))
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
