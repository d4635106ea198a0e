"""Host memory of a CPU update: peak, what the allocator keeps afterwards, and what gives it back.

The embedded model (``smollm2-135m``, LoRA r=16 on every projection) runs one update, the shape of a
GRPO step's (4 micro-batches of 2 sequences x 800 tokens: by default a 770-token prompt and 30 response
tokens, ``--prompt-tokens``/``--response-tokens`` change them; forward and backward through
``rl.batching.forward_logprobs`` as the trainer calls it), three times, in a fresh process per variant,
side by side in one run:

- ``default``: float32, no activation checkpointing, glibc's default allocator settings; the response
  tokens' logprobs chunked along the positions (no full-vocabulary logits for the whole micro-batch);
- ``full logits``: the same, with the whole micro-batch's float32 logits at once (``log_softmax`` over
  ``[2, response, 49152]``), the path the update took before the chunking;
- ``checkpointing``: ``UpdateConfig(gradient_checkpointing=True)``'s recomputation of each layer;
- ``bf16``: ``HFEngine(autocast="bfloat16")`` (the benchmarks' ``--bf16``);
- ``mmap 1 MiB``: ``MALLOC_MMAP_THRESHOLD_=1048576`` in the environment: glibc serves every block of
  1 MiB or more with its own mapping and unmaps it when freed;
- ``checkpointing + mmap 1 MiB``: both, what ``agl.Trainer`` does by default (``UpdateConfig``'s
  ``gradient_checkpointing=None``, on where the model supports it, and ``host_mmap_threshold_mib=1.0``).

Per variant: update time (mean of the 2nd and 3rd update), the process's peak RSS, its RSS right after
the updates (what the allocator kept) and after ``release_host_memory()`` (``malloc_trim(0)``, which the
trainer now calls after every update and evaluation), and the time that call took.

    python -m benchmarks.perf.bench_memory --threads 1         # writes memory_results.md/.json
    python -m benchmarks.perf.bench_memory --threads 1 --prompt-tokens 200 --response-tokens 600 \
        --variants default "full logits" --out benchmarks/perf/memory_results_long.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average
from benchmarks.perf._child import emit, run_child, write_results
from benchmarks.perf.bench_grpo_step import _git_state, _versions

HERE = Path(__file__).resolve().parent
MODEL = "smollm2-135m"
VARIANTS = {
    "default": {},
    "full logits": {},
    "checkpointing": {},
    "bf16": {},
    "mmap 1 MiB": {"MALLOC_MMAP_THRESHOLD_": "1048576"},
    "checkpointing + mmap 1 MiB": {"MALLOC_MMAP_THRESHOLD_": "1048576"},
}


def measure(
    variant: str, threads: int, prompt_tokens: int = 770, response_tokens: int = 30
) -> dict[str, Any]:
    """Run in a child process: three updates, then the memory figures."""
    import threading

    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.rl import batching
    from agentlightning_lite.rl._memory import peak_rss_mib, release_host_memory, rss_mib
    from agentlightning_lite.rl._runtime import enable_gradient_checkpointing
    from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
    from agentlightning_lite.serving.engines import HFEngine

    torch.set_num_threads(threads)
    engine = HFEngine(
        MODEL, lora=agl.LoRA(r=16, alpha=32), autocast="bfloat16" if variant == "bf16" else None, seed=0
    )
    model = engine.model
    if variant.startswith("checkpointing"):
        enable_gradient_checkpointing(model)
    gen = torch.Generator().manual_seed(0)

    def seq(n: int) -> list[int]:
        return [int(x) for x in torch.randint(100, 40000, (n,), generator=gen)]

    batches = [
        collate([Sample(seq(prompt_tokens), seq(response_tokens), None, 1.0, None) for _ in range(2)], 0)
        for _ in range(4)
    ]

    def logprobs(b: Any) -> Any:
        if variant == "full logits":
            ctx = (
                torch.autocast("cpu", engine.autocast_dtype)
                if engine.autocast_dtype
                else batching.nullcontext()
            )
            return batching._forward_logprobs_full(model, b, None, ctx)[0]
        return forward_logprobs(model, b, None, engine.autocast_dtype)[0]

    release_host_memory()
    loaded = rss_mib() or 0.0
    peak = [loaded]
    stop = threading.Event()

    def watch() -> None:  # ru_maxrss also counts the model load; this is the update's own peak
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib() or 0.0)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    model.train()
    times = []
    for _ in range(3):
        t = time.perf_counter()
        for b in batches:
            (-logprobs(b).sum()).backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
    stop.set()
    watcher.join()
    kept = rss_mib() or 0.0
    t = time.perf_counter()
    released = release_host_memory()
    trim_s = time.perf_counter() - t
    out = {
        "variant": variant,
        "update_s": sum(times[1:]) / 2,
        "loaded_mib": loaded,
        "peak_mib": max(peak[0], kept),
        "kept_mib": kept,
        "released_mib": rss_mib() or 0.0,
        "release_s": trim_s,
        "released": released,
        "process_peak_mib": peak_rss_mib(),
    }
    engine.close()
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.perf.bench_memory", description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=770)
    ap.add_argument("--response-tokens", type=int, default=30)
    ap.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS))
    ap.add_argument("--out", type=Path, default=HERE / "memory_results.md")
    ap.add_argument("--child", choices=tuple(VARIANTS), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(measure(args.child, args.threads, args.prompt_tokens, args.response_tokens))
        return {}
    runs = []
    for variant in args.variants:
        env = VARIANTS[variant]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        child = ["--child", variant, "--threads", str(args.threads)]
        child += ["--prompt-tokens", str(args.prompt_tokens), "--response-tokens", str(args.response_tokens)]
        r = run_child("benchmarks.perf.bench_memory", child, {**clean, **env})
        runs.append(r)
        print(
            f"{variant}: update {r['update_s']:.2f} s, peak {r['peak_mib']:.0f} MiB, "
            f"kept {r['kept_mib']:.0f} MiB, after release {r['released_mib']:.0f} MiB",
            flush=True,
        )
    base = runs[0]
    results = {
        "date": dt.date.today().isoformat(),
        "command": "python -m benchmarks.perf.bench_memory "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_model(),
        "load_average": load_average(),
        "threads": args.threads,
        "prompt_tokens": args.prompt_tokens,
        "response_tokens": args.response_tokens,
        "python": platform.python_version(),
        "versions": _versions(),
        "git": _git_state(),
        "runs": runs,
    }
    lines = [
        f"# Host memory of a CPU update (SmolLM2-135M, LoRA r=16, 4 micro-batches of 2 x "
        f"({args.prompt_tokens} prompt + {args.response_tokens} response) tokens)",
        "",
        f"`{results['command'].strip()}` on {results['date']}: {results['cpu']}, {args.threads} thread(s), "
        f"load average {results['load_average']}; {results['git']}. Each variant is a fresh process; "
        "RSS in MiB; 'kept' is the RSS right after the updates, 'released' after `release_host_memory()`.",
        "",
        "| variant | update s | x default | model loaded | peak | kept | released | release ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {r['variant']} | {r['update_s']:.2f} | {r['update_s'] / base['update_s']:.2f}x | "
            f"{r['loaded_mib']:.0f} | {r['peak_mib']:.0f} | {r['kept_mib']:.0f} | {r['released_mib']:.0f} | "
            f"{r['release_s'] * 1000:.0f} |"
            for r in runs
        ),
        "",
    ]
    write_results(args.out, lines, results)
    return results


if __name__ == "__main__":
    main()
