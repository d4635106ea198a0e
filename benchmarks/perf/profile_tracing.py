"""Where an episode's time goes in the embedded tracer, against the OpenTelemetry SDK in the same process.

Runs ``bench_tracing``'s episode (a rollout, an agent span, two LLM calls with token ids, a tool
call, a reward: 5 spans) with parts of the tracer's work taken away in turn, and prints the CPU time
of this thread per episode for each (medians of the repeats; CPU time, so that other load on the
machine counts less than in wall time):

- ``full``: the tracer into a MemoryStore, as in the benchmark;
- ``no store``: the same with ``add_span_rows`` a no-op (the store's bookkeeping taken away);
- ``no store, no JSON``: also without encoding the payloads (the defensive copy taken away);
- ``rollout only``: ``with tracer.rollout(...)`` and nothing inside;
- the OTel SDK's episode (SimpleSpanProcessor, in-memory exporter).

    python -m benchmarks.perf.profile_tracing --episodes 3000 --repeats 5
"""

from __future__ import annotations

import argparse
import functools
import gc
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite import span_handles

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
    print(f"load average at the end: {os.getloadavg()[0]:.2f} (1 min)")
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
    need = otel / 10
    print(f"\nfor 10x the OTel SDK an episode would have to take {need:.1f} us; it takes {med['full']:.1f}")


if __name__ == "__main__":
    main()
