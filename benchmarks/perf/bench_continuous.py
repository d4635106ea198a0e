"""A step with mixed reply lengths on the HF engine: batches decoded to their longest row (the landed code)
vs continuous batching (rows leave as they end, new calls join; a shared prompt prefilled once).

The step is what an RL trainer sends the engine: ``--requests`` rollouts start together
(``engine.expect``), in groups of ``--group`` rollouts sharing a prompt (GRPO); one rollout asks for a
long reply (``--long`` tokens), the others for short ones (``--short`` tokens) and, being agents, send
``--turns`` calls in a row (each next prompt is the last prompt, its reply and a few more tokens). Reply
lengths are forced: the end-of-sequence token is masked, so every reply runs to its ``max_tokens``.
Sampling is seeded (temperature 1). Each variant runs in a fresh process: the landed code from a copy
of ``--base-rev`` (``git archive`` into ``--base-dir``), the working tree's code after it. Measured: the
step's wall time, each call's latency (submit to result), when the short rollouts were all done.

    python -m benchmarks.perf.bench_continuous                   # writes continuous_results.md/.json
    python -m benchmarks.perf.bench_continuous --model tiny --requests 4 --short 4 --long 16 --turns 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average
from benchmarks.perf._child import emit, run_child, write_results
from benchmarks.perf.bench_grpo_step import _git_state, _versions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BASE_REV = "39b3a67"
PROMPTS = [
    "Solve step by step: a train leaves at 3 pm going 60 km/h; when has it covered 150 km?",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Summarise the causes of the French Revolution in a few sentences.",
    "List three uses of a paperclip other than holding paper, and explain each.",
]


def build_engine(model: str, max_batch_size: int, threads: int) -> Any:
    """The engine under test, the end-of-sequence token masked (replies run to their ``max_tokens``)."""
    import torch

    from agentlightning_lite.serving.engines import HFEngine

    torch.set_num_threads(threads)
    if model == "tiny":
        from transformers import LlamaConfig, LlamaForCausalLM

        from agentlightning_lite.serving.tokenizer import ByteTokenizer

        tok = ByteTokenizer()
        torch.manual_seed(0)
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=8192,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
            pad_token_id=tok.pad_token_id,
        )
        engine = HFEngine(
            LlamaForCausalLM(config).eval(),
            tokenizer=tok,
            model_name="tiny",
            max_batch_size=max_batch_size,
            seed=0,
        )
    else:
        engine = HFEngine(model, device="cpu", max_batch_size=max_batch_size, seed=0)
    eos = sorted(engine.eos_token_ids)

    def no_eos(module: Any, args: Any, output: Any) -> Any:
        output.logits[..., eos] = float("-inf")
        return output

    engine.model.register_forward_hook(no_eos)
    return engine


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """In a child process: one variant's step."""
    from agentlightning_lite.serving.engines import GenRequest

    engine = build_engine(args.model, args.max_batch_size, args.threads)
    encode = engine.encode

    def chat(text: str) -> list[int]:
        if args.model == "tiny":
            return encode(text)
        return encode(engine.apply_chat_template([{"role": "user", "content": text}]))

    engine.generate([GenRequest(chat("warm up"), max_tokens=4, temperature=1.0, seed=0)])
    engine.reset_stats()
    calls: list[dict[str, Any]] = []
    lock = threading.Lock()
    start = threading.Barrier(args.requests + 1)

    def rollout(i: int) -> None:
        ids = chat(PROMPTS[(i // args.group) % len(PROMPTS)])
        long = i == args.requests - 1
        turns = 1 if long else args.turns
        start.wait()
        for turn in range(turns):
            req = GenRequest(
                ids, max_tokens=args.long if long else args.short, temperature=1.0, seed=1000 * i + turn
            )
            t0 = time.perf_counter()
            res = engine.submit(req).result()
            t1 = time.perf_counter()
            with lock:
                calls.append(
                    {
                        "rollout": i,
                        "turn": turn,
                        "long": long,
                        "prompt_tokens": len(ids),
                        "tokens": res.num_tokens,
                        "start_s": t0 - t_start,
                        "end_s": t1 - t_start,
                        "latency_s": t1 - t0,
                    }
                )
            ids = [*ids, *res.token_ids, *encode(" Go on.")]

    threads = [threading.Thread(target=rollout, args=(i,)) for i in range(args.requests)]
    for t in threads:
        t.start()
    engine.expect(args.requests)
    t_start = time.perf_counter()
    start.wait()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t_start
    stats = engine.stats
    engine.close()
    short = [c for c in calls if not c["long"]]
    long_calls = [c for c in calls if c["long"]]
    return {
        "wall_s": wall,
        "short_done_s": max((c["end_s"] for c in short), default=0.0),
        "short_latency_p50_s": statistics.median(c["latency_s"] for c in short) if short else 0.0,
        "short_latency_max_s": max((c["latency_s"] for c in short), default=0.0),
        "long_latency_s": long_calls[0]["latency_s"] if long_calls else 0.0,
        "generated_tokens": sum(c["tokens"] for c in calls),
        "calls": sorted(calls, key=lambda c: (c["rollout"], c["turn"])),
        "stats": {k: v for k, v in stats.items() if k != "batch_sizes"},
    }


def base_checkout(rev: str, where: Path | None) -> Path:
    """A copy of ``src/`` at ``rev`` (``git archive``), made once; returns its ``src`` directory."""
    where = where or Path(tempfile.gettempdir()) / f"agl-base-{rev}"
    src = where / "src"
    if not (src / "agentlightning_lite").is_dir():
        where.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return src


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.perf.bench_continuous",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--model", default="smollm2-135m", help="an HFEngine model, or 'tiny' (a random 2-layer Llama)"
    )
    ap.add_argument(
        "--requests", type=int, default=32, help="rollouts of the step (the last one is the long one)"
    )
    ap.add_argument("--group", type=int, default=8, help="rollouts sharing a prompt (GRPO group size)")
    ap.add_argument("--short", type=int, default=32, help="tokens of each short reply")
    ap.add_argument("--long", type=int, default=600, help="tokens of the long reply")
    ap.add_argument("--turns", type=int, default=3, help="calls of each short rollout, one after the other")
    ap.add_argument("--max-batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--base-rev", default=BASE_REV, help="the landed code to compare with")
    ap.add_argument("--base-dir", type=Path, default=None, help="where its copy goes (default: a temp dir)")
    ap.add_argument("--out", type=Path, default=HERE / "continuous_results.md")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(measure(args))
        return {}
    child_args = [
        "--child",
        *("--model", args.model, "--requests", str(args.requests), "--group", str(args.group)),
        *("--short", str(args.short), "--long", str(args.long), "--turns", str(args.turns)),
        *("--max-batch-size", str(args.max_batch_size), "--threads", str(args.threads)),
    ]
    sources = {"before": base_checkout(args.base_rev, args.base_dir), "after": ROOT / "src"}
    runs = {}
    for variant, src in sources.items():
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(ROOT)])}
        runs[variant] = run_child("benchmarks.perf.bench_continuous", child_args, env=env)
        r = runs[variant]
        print(
            f"{variant}: step {r['wall_s']:.2f} s, short rollouts done at {r['short_done_s']:.2f} s, "
            f"long reply {r['long_latency_s']:.2f} s",
            flush=True,
        )
    b, a = runs["before"], runs["after"]
    rows = [
        ("step wall time, s", "wall_s"),
        ("all short rollouts done, s", "short_done_s"),
        ("short call latency, median s", "short_latency_p50_s"),
        ("short call latency, max s", "short_latency_max_s"),
        ("long call latency, s", "long_latency_s"),
    ]
    results = {
        "date": dt.date.today().isoformat(),
        "command": "python -m benchmarks.perf.bench_continuous " + " ".join(argv or sys.argv[1:]),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average": load_average(),
        "python": platform.python_version(),
        "versions": _versions(),
        "git": _git_state(),
        "base_rev": args.base_rev,
        "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out", "base_dir")},
        "before": b,
        "after": a,
    }
    stats_keys = ["prefill_tokens", "decode_tokens", "prefix_cache_hits", "batches", "max_batch_size"]
    lines = [
        f"# Continuous batching: a step with one long reply ({args.model})",
        "",
        f"`{results['command'].strip()}` on {results['date']}: {results['cpu']}, {results['cores']} cores, "
        f"{args.threads} torch thread(s), load average {results['load_average']}; {results['git']}; "
        f"before: {args.base_rev}.",
        "",
        f"{args.requests} rollouts start together in groups of {args.group} sharing a prompt: "
        f"{args.requests - 1} send {args.turns} calls of {args.short} tokens one after the other, one sends "
        f"a call of {args.long} tokens (end of sequence masked, temperature 1, seeded); "
        f"max_batch_size={args.max_batch_size}.",
        "",
        "| measure | before (batch to its longest row) | after (continuous) | after / before |",
        "|---|---:|---:|---:|",
        *(
            f"| {m} | {b[k]:.2f} | {a[k]:.2f} | {a[k] / b[k] if b[k] else float('nan'):.2f}x |"
            for m, k in rows
        ),
        "",
        "Engine counters after: " + ", ".join(f"{k} {a['stats'].get(k, '-')}" for k in stats_keys) + ".",
        "",
        "Each call's latency, s (rollout/turn: before, after):",
        "",
        "| rollout | turn | tokens | before | after |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {cb['rollout']} | {cb['turn']} | {cb['tokens']} | {cb['latency_s']:.2f} "
            f"| {ca['latency_s']:.2f} |"
            for cb, ca in zip(b["calls"], a["calls"], strict=True)
        ),
        "",
    ]
    write_results(args.out, lines, results)
    return results


if __name__ == "__main__":
    main()
