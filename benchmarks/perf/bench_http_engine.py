"""Tokens per second through the HTTP engine against the in-process HF engine, side by side in one run.

The same model (SmolLM2-135M from the embedded GGUF, float32 on CPU) generates the same greedy replies
two ways: ``HFEngine`` in this process, and ``HTTPEngine`` here sending token ids to a PolicyServer
in a child process that serves an ``HFEngine`` (the way a trainer drives vLLM: the inference server in
its own process). Each at 1 and 16 concurrent requests; the replies must be the same tokens both ways.
The two never run at the same time.

    python -m benchmarks.perf.bench_http_engine     # prints a table, writes http_engine_results.md/.json
    python -m benchmarks.perf.bench_http_engine --max-tokens 16 --rounds 1 --no-write   # a quick look
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

SERVER = """
import sys
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import HFEngine
engine = HFEngine("smollm2-135m", num_threads={threads}, max_batch_size=16, seed=0)
server = PolicyServer(engine, record_unrouted=False).start()
print(server.url, flush=True)
server.serve_forever()
"""

QUESTIONS = [f"Write one sentence about the number {i}." for i in range(16)]


def run(
    engine: Any, prompts: list[list[int]], concurrency: int, max_tokens: int, rounds: int
) -> dict[str, Any]:
    """Generate ``rounds`` times for ``concurrency`` prompts at once; tokens per second of wall time."""
    from agentlightning_lite.serving.engines import GenRequest

    tokens = 0
    replies: list[list[int]] = []
    start = time.perf_counter()
    for _ in range(rounds):
        batch = prompts[:concurrency]
        futures = [
            engine.submit(
                GenRequest(prompt_token_ids=p, max_tokens=max_tokens, temperature=0, session=f"s{i}")
            )
            for i, p in enumerate(batch)
        ]
        results = [f.result() for f in futures]
        tokens += sum(r.num_tokens for r in results)
        replies = [r.token_ids for r in results]
    wall = time.perf_counter() - start
    return {
        "tokens": tokens,
        "seconds": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "replies": replies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per concurrency level")
    parser.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch threads of each engine"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()

    from agentlightning_lite.serving.engines import GenRequest, HFEngine, HTTPEngine

    local = HFEngine("smollm2-135m", num_threads=args.threads, max_batch_size=16, seed=0)
    prompts = [local.encode(local.apply_chat_template([{"role": "user", "content": q}])) for q in QUESTIONS]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER.format(threads=args.threads)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    rows: list[dict[str, Any]] = []
    try:
        url = proc.stdout.readline().strip()  # type: ignore[union-attr]
        http = HTTPEngine(url, tokenizer=local.tokenizer)
        for engine in (
            local,
            http,
        ):  # warm-up: one-off costs, and each batcher sees 16 requests come together
            engine.generate([GenRequest(prompt_token_ids=p, max_tokens=2, temperature=0) for p in prompts])
        for concurrency in (1, 16):
            direct = run(local, prompts, concurrency, args.max_tokens, args.rounds)
            remote = run(http, prompts, concurrency, args.max_tokens, args.rounds)
            rows.append(
                {
                    "concurrency": concurrency,
                    "in_process_tokens_per_s": direct["tokens_per_s"],
                    "http_tokens_per_s": remote["tokens_per_s"],
                    "ratio": round(remote["tokens_per_s"] / direct["tokens_per_s"], 2),
                    "tokens": direct["tokens"],
                    "same_tokens": direct["replies"] == remote["replies"],
                }
            )
        http.close()
    finally:
        proc.terminate()
        proc.wait(30)
        local.close()
    head = (
        "| concurrent requests | in-process HFEngine (tokens/s) | HTTPEngine -> PolicyServer (tokens/s) "
        "| ratio | same tokens |"
    )
    lines = [head, "|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['in_process_tokens_per_s']} | {r['http_tokens_per_s']} "
            f"| {r['ratio']}x "
            f"| {'yes' if r['same_tokens'] else 'NO'} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.no_write:
        return
    meta = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "model": "smollm2-135m (GGUF, float32, CPU)",
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "threads": args.threads,
    }
    (HERE / "http_engine_results.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    (HERE / "http_engine_results.md").write_text(
        "# HTTP engine against the in-process HF engine\n\n"
        f"`python -m benchmarks.perf.bench_http_engine` ({meta['date']}; {meta['machine']}; {meta['model']}; "
        f"greedy, {args.max_tokens} new tokens at most, {args.rounds} rounds per level, {args.threads} torch "
        "threads per engine; the server in a child process, never running beside the in-process engine).\n\n"
        f"{table}\n"
    )


if __name__ == "__main__":
    main()
