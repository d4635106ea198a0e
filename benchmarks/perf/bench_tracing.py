"""Tracing throughput: our embedded tracer (memory and SQLite stores) against the OpenTelemetry SDK.

Every contender records the same agent episodes: an agent span holding an LLM call (chat messages
in, a reply out, 64 prompt and 32 response token ids with logprobs) and a tool call, then the
next LLM call. Spans per second are measured over whole episodes; transitions per second are the
rate of ``agl.transitions()`` over the stored episodes.

    python -m benchmarks.perf.bench_tracing            # prints a table, writes tracing_results.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import gc
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import agentlightning_lite as agl

HERE = Path(__file__).resolve().parent
PROMPT = [
    {"role": "system", "content": "You are a careful math agent."},
    {"role": "user", "content": "What is 12 * 7 + 3? Use the calculator."},
]
REPLY = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": '{"expr": "12*7+3"}'}}
    ],
}
PROMPT_IDS = list(range(1000, 1064))
RESPONSE_IDS = list(range(2000, 2032))
LOGPROBS = [-0.25] * 32
SPANS_PER_EPISODE = 5  # agent, llm, tool, llm, reward
TARGET_X_OTEL = 10.0  # the embedded tracer's goal, in spans/s over the fastest OTel SDK pipeline


def agl_episode(tracer: agl.Tracer, i: int) -> None:
    with tracer.rollout({"i": i}, mode="train") as ro:
        with tracer.span("agent", "solver", agent="solver"):
            with tracer.span("llm", "chat", input=PROMPT, model="policy") as sp:
                sp.set_output(REPLY)
                sp.set_tokens(PROMPT_IDS, RESPONSE_IDS, LOGPROBS)
            with tracer.span("tool", "calc", input={"expr": "12*7+3"}) as t:
                t.set_output(87)
            with tracer.span("llm", "chat", input=PROMPT, model="policy") as sp:
                sp.set_output("87")
                sp.set_tokens(PROMPT_IDS, RESPONSE_IDS, LOGPROBS)
        ro.reward(1.0)


def otel_runner(batch: bool) -> tuple[Callable[[int], None], Callable[[], int], Callable[[], None]]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    processor = (
        BatchSpanProcessor(exporter, max_queue_size=1_000_000) if batch else SimpleSpanProcessor(exporter)
    )
    provider.add_span_processor(processor)
    tr = provider.get_tracer("bench")
    prompt_json = json.dumps(PROMPT)
    reply_json = json.dumps(REPLY)

    def episode(i: int) -> None:
        with tr.start_as_current_span("rollout") as root:
            root.set_attribute("task", json.dumps({"i": i}))
            with tr.start_as_current_span("invoke_agent solver") as a:
                a.set_attributes({"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "solver"})
                with tr.start_as_current_span("chat policy") as c:
                    c.set_attributes(
                        {
                            "gen_ai.operation.name": "chat",
                            "gen_ai.request.model": "policy",
                            "gen_ai.input.messages": prompt_json,
                            "gen_ai.output.messages": reply_json,
                            "prompt_token_ids": PROMPT_IDS,
                            "response_token_ids": RESPONSE_IDS,
                            "response_logprobs": LOGPROBS,
                        }
                    )
                with tr.start_as_current_span("execute_tool calc") as t:
                    t.set_attributes(
                        {
                            "gen_ai.operation.name": "execute_tool",
                            "gen_ai.tool.name": "calc",
                            "gen_ai.tool.call.arguments": '{"expr": "12*7+3"}',
                            "gen_ai.tool.call.result": "87",
                        }
                    )
                with tr.start_as_current_span("chat policy") as c:
                    c.set_attributes(
                        {
                            "gen_ai.operation.name": "chat",
                            "gen_ai.request.model": "policy",
                            "gen_ai.input.messages": prompt_json,
                            "gen_ai.output.messages": "87",
                            "prompt_token_ids": PROMPT_IDS,
                            "response_token_ids": RESPONSE_IDS,
                            "response_logprobs": LOGPROBS,
                        }
                    )
            root.set_attribute("reward", 1.0)

    def count() -> int:
        processor.force_flush()
        return len(exporter.get_finished_spans())

    return episode, count, provider.shutdown


def measure(episode: Callable[[int], None], n: int, finish: Callable[[], None] = lambda: None) -> float:
    gc.collect()
    t0 = time.perf_counter()
    for i in range(n):
        episode(i)
    finish()  # flush whatever a batching contender still holds: the spans must be recorded
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=HERE / "tracing_results.md")
    args = ap.parse_args()
    n, tmp = args.episodes, Path(tempfile.mkdtemp())
    load_before = os.getloadavg()  # other work on the machine slows every contender, unevenly
    results: dict[str, list[float]] = {}
    tx_rates: dict[str, list[float]] = {}

    for rep in range(args.repeats):  # interleave contenders so drift hits all of them alike
        mem = agl.MemoryStore()
        mem_tracer = agl.Tracer(mem)
        results.setdefault("agl Tracer -> MemoryStore", []).append(
            n * SPANS_PER_EPISODE / measure(functools.partial(agl_episode, mem_tracer), n)
        )
        sq = agl.SQLiteStore(tmp / f"bench{rep}.db")
        sq_tracer = agl.Tracer(sq)
        results.setdefault("agl Tracer -> SQLiteStore (file, WAL)", []).append(
            n * SPANS_PER_EPISODE / measure(functools.partial(agl_episode, sq_tracer), n, sq.flush)
        )
        for label, batch in (
            ("OTel SDK SimpleSpanProcessor -> InMemory", False),
            ("OTel SDK BatchSpanProcessor -> InMemory", True),
        ):
            ep, count, shutdown = otel_runner(batch)
            secs = measure(ep, n, lambda c=count: c())
            assert count() == n * SPANS_PER_EPISODE, "OTel dropped spans"
            shutdown()
            results.setdefault(label, []).append(n * SPANS_PER_EPISODE / secs)
        assert len(agl.transitions(sq)) == 2 * n
        for label, store in (("transitions() from MemoryStore", mem), ("transitions() from SQLiteStore", sq)):
            gc.collect()
            t0 = time.perf_counter()
            count_tx = len(agl.transitions(store))
            tx_rates.setdefault(label, []).append(count_tx / (time.perf_counter() - t0))
        sq.close()

    med = {k: statistics.median(v) for k, v in results.items()}
    otel_best = max(v for k, v in med.items() if k.startswith("OTel"))
    mem_rate = med["agl Tracer -> MemoryStore"]
    rows = [(k, v, v / otel_best, v / mem_rate) for k, v in med.items()]
    lines = [
        "| contender | spans/s (median) | x fastest OTel SDK | x MemoryStore |",
        "|---|---:|---:|---:|",
        *[f"| {k} | {v:,.0f} | {r:.2f} | {m:.2f} |" for k, v, r, m in rows],
        "",
        "| extraction | transitions/s (median) |",
        "|---|---:|",
        *[f"| {k} | {statistics.median(v):,.0f} |" for k, v in tx_rates.items()],
    ]
    table = "\n".join(lines)
    print(table)
    sqlite_ratio = mem_rate / med["agl Tracer -> SQLiteStore (file, WAL)"]
    agl_vs_otel = mem_rate / otel_best  # in-memory against in-memory
    verdict = (
        f"\nTargets: embedded tracer (MemoryStore) >= {TARGET_X_OTEL:g}x the fastest OTel SDK pipeline "
        f"(in-memory exporter): {agl_vs_otel:.2f}x ({'met' if agl_vs_otel >= TARGET_X_OTEL else 'NOT met'}); "
        f"SQLiteStore within 2x of MemoryStore: {sqlite_ratio:.2f}x slower "
        f"({'met' if sqlite_ratio <= 2 else 'NOT met'})."
    )
    load = "/".join(f"{x:.2f}" for x in load_before), "/".join(f"{x:.2f}" for x in os.getloadavg())
    print(verdict)
    header = (
        "# Tracing throughput\n\n"
        f"Command: `python -m benchmarks.perf.bench_tracing --episodes {n} --repeats {args.repeats}`  \n"
        f"Date: {dt.date.today()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"Python {platform.python_version()}; load average (1/5/15 min) {load[0]} before, "
        f"{load[1]} after.  \n"
        f"Workload: {n} episodes x {SPANS_PER_EPISODE} spans (agent, 2 LLM calls with 64+32 token ids and "
        "logprobs, a tool call, a reward); median of the repeats, contenders interleaved.\n\n"
    )
    args.out.write_text(header + table + "\n" + verdict + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
