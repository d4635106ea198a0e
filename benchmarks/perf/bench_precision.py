"""float32 vs bfloat16 autocast on a CPU: update and decoding time, peak memory, logprob difference.

The embedded model (``smollm2-135m``, float32 weights, LoRA r=16 on every projection) runs the same work
in two fresh processes, one per precision (``HFEngine(autocast=None)`` and ``autocast="bfloat16"``):

- **update**: a forward and backward pass of the LoRA policy over a micro-batch of 2 sequences of
  800 tokens (a 770-token prompt, 30 response tokens: the shape of an agent call with a long system
  prompt), through ``rl.batching.forward_logprobs`` exactly as the trainer calls it;
- **decode**: ``engine.generate`` of 16 requests of 500 prompt tokens and 48 sampled tokens;
- **logprob difference**: mean absolute difference between the bf16 and the fp32 logprobs of the same
  response tokens (same weights, same batch), the price of the precision.

Each measurement is the best of 2 runs after a warm-up. Peak RSS is the process's. bf16 autocast pays off
where the CPU has AMX or AVX512-BF16 units (``lscpu | grep -o 'amx_bf16\\|avx512_bf16'``); elsewhere it
may be slower than float32.

    python -m benchmarks.perf.bench_precision --threads 1          # writes precision_results.md/.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average
from benchmarks.perf._child import emit, run_child, write_results
from benchmarks.perf.bench_grpo_step import _git_state, _versions, peak_rss_mib

HERE = Path(__file__).resolve().parent
MODEL = "smollm2-135m"


def cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next(
        (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []
    )
    have = [f for f in ("amx_bf16", "avx512_bf16", "avx512f") if f in flags]
    return ", ".join(have) or "none of amx_bf16, avx512_bf16, avx512f"


def measure(precision: str, threads: int) -> dict[str, Any]:
    """Run in a child process: one precision's update, decode and logprobs."""
    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
    from agentlightning_lite.serving.engines import GenRequest, HFEngine

    torch.set_num_threads(threads)
    engine = HFEngine(
        MODEL,
        lora=agl.LoRA(r=16, alpha=32),
        autocast="bfloat16" if precision == "bf16" else None,
        seed=0,
        max_batch_size=16,
    )
    model = engine.model
    gen = torch.Generator().manual_seed(0)
    prompts = [[int(x) for x in torch.randint(100, 40000, (770,), generator=gen)] for _ in range(2)]
    responses = [[int(x) for x in torch.randint(100, 40000, (30,), generator=gen)] for _ in range(2)]
    batch = collate([Sample(p, r, None, 0.0, None) for p, r in zip(prompts, responses, strict=True)], 0)
    out: dict[str, Any] = {"precision": precision}

    model.train()
    times = []
    for _ in range(3):  # warm-up + 2
        t = time.perf_counter()
        lp, _ = forward_logprobs(model, batch, None, engine.autocast_dtype)
        (-lp.sum()).backward()
        times.append(time.perf_counter() - t)
        model.zero_grad(set_to_none=True)
    out["update_s"] = min(times[1:])
    with torch.no_grad():
        out["logprobs"] = forward_logprobs(model, batch, None, engine.autocast_dtype)[0].tolist()
    model.eval()

    reqs = [
        GenRequest([int(x) for x in torch.randint(100, 40000, (500,), generator=gen)], max_tokens=48, seed=i)
        for i in range(16)
    ]
    times = []
    for _ in range(3):
        t = time.perf_counter()
        res = engine.generate(reqs)
        times.append(time.perf_counter() - t)
    out["decode_s"] = min(times[1:])
    out["decode_tokens"] = sum(len(r.token_ids) for r in res)
    out["peak_rss_mib"] = peak_rss_mib()
    engine.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.perf.bench_precision", description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "precision_results.md")
    ap.add_argument("--child", choices=("fp32", "bf16"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(measure(args.child, args.threads))
        return {}
    runs = {}
    for precision in ("fp32", "bf16"):
        runs[precision] = run_child(
            "benchmarks.perf.bench_precision", ["--child", precision, "--threads", str(args.threads)]
        )
        r = runs[precision]
        print(f"{precision}: update {r['update_s']:.2f} s, decode {r['decode_s']:.2f} s", flush=True)
    f, b = runs["fp32"], runs["bf16"]
    diff = [
        abs(x - y)
        for rf, rb in zip(f["logprobs"], b["logprobs"], strict=True)
        for x, y in zip(rf, rb, strict=True)
    ]
    rows = [
        ("update: forward + backward, 2 x 800 tokens, s", f["update_s"], b["update_s"]),
        ("decode: 16 requests x (500 + 48) tokens, s", f["decode_s"], b["decode_s"]),
        ("peak RSS of the process, MiB", f["peak_rss_mib"], b["peak_rss_mib"]),
    ]
    results = {
        "date": dt.date.today().isoformat(),
        "command": "python -m benchmarks.perf.bench_precision " + " ".join(argv or sys.argv[1:]),
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "load_average": load_average(),
        "threads": args.threads,
        "python": platform.python_version(),
        "versions": _versions(),
        "git": _git_state(),
        "rows": [{"measure": m, "fp32": x, "bf16": y, "ratio": y / x} for m, x, y in rows],
        "logprob_abs_diff_mean": sum(diff) / len(diff),
        "logprob_abs_diff_max": max(diff),
    }
    lines = [
        "# float32 vs bfloat16 autocast on a CPU (SmolLM2-135M, LoRA r=16)",
        "",
        f"`{results['command'].strip()}` on {results['date']}: {results['cpu']} ({results['cpu_flags']}), "
        f"{args.threads} thread(s), load average {results['load_average']}; {results['git']}.",
        "",
        "| measure | float32 | bf16 autocast | bf16 / fp32 |",
        "|---|---:|---:|---:|",
        *(f"| {m} | {x:.2f} | {y:.2f} | {y / x:.2f}x |" for m, x, y in rows),
        "",
        f"Logprobs of the same 60 response tokens, bf16 vs float32: mean absolute difference "
        f"{results['logprob_abs_diff_mean']:.4f}, largest {results['logprob_abs_diff_max']:.4f} (nats).",
        "",
    ]
    write_results(args.out, lines, results)
    return results


if __name__ == "__main__":
    main()
