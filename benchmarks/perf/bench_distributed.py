"""The update of one GRPO step on 1 rank against 2 data-parallel ranks (gloo, ``torchrun``) on this machine.

Every variant updates the same LoRA adapter (r=16, alpha=32, the default target modules) on the same
samples: ``--samples`` calls (default 32: 4 tasks x 8) of seeded random token ids, prompts of
``--prompt-tokens`` and responses of 8 to ``--response-tokens`` tokens (uneven, so the token split
has work to do), with GRPO-style advantages, in fresh processes. Rank 0 makes the samples and, on 2
ranks, broadcasts them (as ``Trainer.fit`` does); each process runs ``--warmup`` untimed updates,
then the timed one (from a barrier to a barrier). Variants:

- ``1 rank x T threads`` for T in 1 and the core count (the single process using the whole machine);
- ``2 ranks x T/2 threads`` under ``torchrun --nproc_per_node 2`` (gloo);
- the same 2 ranks with the decoder layers' frozen weights sharded by FSDP2 (``rl.fsdp.shard_base``;
  ``--no-fsdp`` leaves this row out).

Reported per variant: the update's wall time (the timed update, the slowest rank), its reference phase
(old logprobs: each rank computes those of its own micro-batches, plus, with ``old_logprobs="auto"``,
the first that carries engine logprobs, where they are checked; under FSDP2 every rank computes all
of them, since sharded layers need every rank in each forward pass) and its update phase
(forward/backward of the rank's share, the gradient all-reduce, the optimiser step), each rank's
peak RSS and its RSS after the update, the step's ``dist/token_imbalance``, and the largest difference
of the final adapter from the 1-rank one.

    python -m benchmarks.perf.bench_distributed                     # smollm2-135m, writes the results
    python -m benchmarks.perf.bench_distributed --model tiny --samples 8 --no-write   # a smoke test
    python -m benchmarks.perf.bench_distributed --worker OUT ...    # one process (what the parent runs)
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(ROOT) not in sys.path:  # torchrun runs this file as a script
    sys.path.insert(0, str(ROOT))


def _samples(n: int, prompt_tokens: int, response_tokens: int, vocab: int) -> list[Any]:
    import torch

    from agentlightning_lite.rl.batching import Sample

    g = torch.Generator().manual_seed(1234)
    out = []
    for i in range(n):
        r = int(torch.randint(8, max(response_tokens, 9) + 1, (1,), generator=g))
        out.append(
            Sample(
                prompt_ids=torch.randint(0, vocab, (prompt_tokens,), generator=g).tolist(),
                response_ids=torch.randint(0, vocab, (r,), generator=g).tolist(),
                engine_logprobs=None,
                reward=float(i % 2),
                group=("task", i // 8),
                advantage=(1.0 if i % 2 else -1.0) * (0.5 + 0.05 * (i % 8)),
                rollout_id=f"r{i}",
                meta={"policy": "policy"},
            )
        )
    return out


def _model(name: str) -> tuple[Any, int, int]:
    """The model with LoRA r=16 attached, its vocabulary size and its padding id."""
    import torch

    import agentlightning_lite as agl
    from agentlightning_lite.lora_settings import attach_lora

    if name == "tiny":
        from tests._helpers import BYTE_EOS, tiny_llama

        base, pad = tiny_llama(), BYTE_EOS
    else:
        from agentlightning_lite.models import load_model

        base = load_model(name, dtype=torch.float32)
        pad = int(base.config.eos_token_id or 0)
    torch.manual_seed(0)  # the same LoRA init in every process
    model = attach_lora(base, agl.LoRA(r=16, alpha=32))
    return model, int(base.config.vocab_size), pad


def worker(args: argparse.Namespace) -> None:
    """One process (or one rank under torchrun): the update(s), then ``OUT/rank<r>.json``."""
    import torch

    torch.set_num_threads(args.threads)
    from agentlightning_lite.rl.distributed import DataParallel
    from agentlightning_lite.rl.grpo import GRPO
    from agentlightning_lite.rl.timing import Timer
    from agentlightning_lite.rl.update import UpdateSettings, optimise

    dp = DataParallel.from_env(timeout_s=1800.0)
    rank = dp.rank if dp else 0
    model, vocab, pad = _model(args.model)
    if args.fsdp and dp is not None:
        from agentlightning_lite.rl.fsdp import shard_base

        shard_base(model, dp)
    params = [p for p in model.parameters() if p.requires_grad]
    algo = GRPO(micro_batch_size=args.micro_batch, lr=1e-4, epochs=1)
    opt = torch.optim.AdamW(params, lr=algo.lr, weight_decay=0.01)
    made = _samples(args.samples, args.prompt_tokens, args.response_tokens, vocab) if rank == 0 else None
    samples = dp.broadcast_samples(made) if dp else made
    assert samples is not None
    metrics: dict[str, float] = {}
    seconds = 0.0
    before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    for i in range(args.warmup + 1):
        timer = Timer()
        cfg = UpdateSettings(device=torch.device("cpu"), pad_id=pad, data_parallel=dp, timer=timer)
        if dp:
            dp.barrier()
        t0 = time.perf_counter()
        metrics = optimise(model, samples, algo, opt, None, cfg)
        if dp:
            dp.barrier()  # the update ends when the slowest rank's does
        seconds = time.perf_counter() - t0
        metrics.update(timer.metrics())
        if i < args.warmup:
            print(f"rank {rank}: warm-up update {i + 1} took {seconds:.2f} s", file=sys.stderr, flush=True)
    state = {n: p.detach() for n, p in model.named_parameters() if "lora_" in n}
    moved = max(float((state[n] - before[n]).abs().max()) for n in before)
    digest = DataParallel.checksum(state.items())
    agree = dp.all_equal(digest) if dp else True
    out = Path(args.worker)
    out.mkdir(parents=True, exist_ok=True)
    if rank == 0:
        torch.save({n: t.clone() for n, t in state.items()}, out / "adapter.pt")
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "update_s": seconds,
                "reference_s": sum(metrics.get(f"timing/{k}_logprobs", 0.0) for k in ("old", "ref")),
                "update_phase_s": metrics.get("timing/update", float("nan")),
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "rss_after_mib": _rss_mib(),
                "token_imbalance": metrics.get("dist/token_imbalance", 1.0),
                "loss": metrics.get("train/loss"),
                "sequence_tokens": metrics.get("train/sequence_tokens"),
                "adapter_moved": moved,
                "checksum": digest,
                "ranks_agree": agree,
                "threads": args.threads,
            }
        )
    )
    if dp:
        dp.close()


def _rss_mib() -> float:
    """This process's resident memory now (``VmRSS``), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker_args(args: argparse.Namespace, out: Path, threads: int, fsdp: bool) -> list[str]:
    return ["--fsdp"] * fsdp + [
        "--worker", str(out), "--threads", str(threads), "--model", args.model,
        "--samples", str(args.samples), "--prompt-tokens", str(args.prompt_tokens),
        "--response-tokens", str(args.response_tokens), "--micro-batch", str(args.micro_batch),
        "--warmup", str(args.warmup),
    ]  # fmt: skip


def _run(args: argparse.Namespace, out: Path, ranks: int, threads: int, fsdp: bool) -> list[dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update({"OMP_NUM_THREADS": str(threads), "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"})
    script = [str(Path(__file__).resolve()), *_worker_args(args, out, threads, fsdp)]
    if ranks == 1:
        cmd = [sys.executable, *script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks)]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(_port()), *script]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
    rows = [json.loads((out / f"rank{r}.json").read_text()) for r in range(ranks)]
    for r in rows:
        r["process_s"] = time.perf_counter() - t0
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="a model name, or 'tiny' (the tests' tiny Llama)")
    p.add_argument("--samples", type=int, default=32, help="calls in the step (default 4 tasks x 8)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--response-tokens", type=int, default=96, help="responses have 8 to this many tokens")
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1, help="untimed updates before the timed one")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 2, help="threads of the 1-rank variant")
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--fsdp", action="store_true", help=argparse.SUPPRESS)  # a worker: shard the base
    p.add_argument("--no-fsdp", action="store_true", help="leave out the 2-rank FSDP2 row")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-write", action="store_true", help="print the table only (smoke tests)")
    p.add_argument("--out", type=Path, default=HERE / "distributed_results.md")
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return
    import tempfile

    import torch

    from benchmarks._harness import cpu_model, load_average

    half = max(1, args.cores // 2)
    variants = list(dict.fromkeys([(1, 1, False), (1, args.cores, False), (2, half, False)]))
    if not args.no_fsdp:
        variants.append((2, half, True))
    load_before = load_average()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="agl-bench-dist-") as tmp:
        ref: dict[str, Any] | None = None
        for ranks, threads, fsdp in variants:
            out = Path(tmp) / f"{ranks}x{threads}{'-fsdp' * fsdp}"
            rows = _run(args, out, ranks, threads, fsdp)
            adapter = torch.load(out / "adapter.pt")
            ref = ref or adapter
            diff = max(float((adapter[n] - ref[n]).abs().max()) for n in ref)
            results.append(
                {
                    "ranks": ranks,
                    "threads_per_rank": threads,
                    "fsdp": fsdp,
                    "rss_after_mib": [round(r["rss_after_mib"], 1) for r in rows],
                    "update_s": max(r["update_s"] for r in rows),
                    "reference_s": max(r["reference_s"] for r in rows),
                    "update_phase_s": max(r["update_phase_s"] for r in rows),
                    "peak_rss_mib": [round(r["peak_rss_mib"], 1) for r in rows],
                    "token_imbalance": rows[0]["token_imbalance"],
                    "ranks_agree": all(r["ranks_agree"] for r in rows),
                    "max_abs_diff_vs_first": diff,
                    "adapter_moved": rows[0]["adapter_moved"],
                    "loss": rows[0]["loss"],
                    "sequence_tokens": rows[0]["sequence_tokens"],
                }
            )
            label = f"{ranks} rank(s) x {threads} thread(s){' FSDP2' * fsdp}"
            print(f"{label}: {results[-1]['update_s']:.2f} s", file=sys.stderr)
    given = argv if argv is not None else sys.argv[1:]
    cmd = "python -m benchmarks.perf.bench_distributed " + " ".join(given)
    base = results[0]["update_s"]
    lines = [
        "# Data-parallel update: 1 rank against 2 ranks (gloo) on one machine",
        "",
        f"Command: `{cmd.strip()}` ({dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}).",
        f"Machine: {cpu_model()}, {os.cpu_count()} cores, no GPU; torch {torch.__version__}; load average "
        f"before {load_before}, after {load_average()}.",
        f"Model: `{args.model}` in float32 with LoRA r=16 (alpha 32, default target modules); one GRPO "
        f"update (1 epoch, micro-batches of {args.micro_batch}) on {args.samples} calls of "
        f"{args.prompt_tokens} prompt tokens and 8-{args.response_tokens} response tokens "
        f"({results[0]['sequence_tokens']:.0f} tokens in all); {args.warmup} untimed warm-up "
        "update(s), then the timed one.",
        "",
        "| ranks x threads | update (s) | reference phase (s) | update phase (s) | speed-up | peak RSS per "
        "rank (MiB) | RSS after, per rank (MiB) | token imbalance | adapter max diff vs 1x1 (moved) | "
        "ranks agree |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['ranks']} x {r['threads_per_rank']}{' FSDP2' * r['fsdp']} | {r['update_s']:.2f} | "
            f"{r['reference_s']:.2f} | "
            f"{r['update_phase_s']:.2f} | {base / r['update_s']:.2f}x | "
            f"{', '.join(f'{m:.0f}' for m in r['peak_rss_mib'])} | "
            f"{', '.join(f'{m:.0f}' for m in r['rss_after_mib'])} | {r['token_imbalance']:.3f} | "
            f"{r['max_abs_diff_vs_first']:.1e} ({r['adapter_moved']:.1e}) | "
            f"{'yes' if r['ranks_agree'] else 'NO'} |"
        )
    lines += [
        "",
        "update: the timed update from a barrier to a barrier (the slowest rank); the reference phase (old "
        "logprobs) covers each rank's own micro-batches (plus, with old_logprobs='auto', the first that "
        "carries engine logprobs; all of them under FSDP2, whose sharded layers need every rank in each "
        "forward pass), the update phase is each rank's share of the "
        "forward/backward, the gradient all-reduce and the optimiser step (the slowest rank's). Peak RSS: "
        "`ru_maxrss` of each rank's process (model loading included: FSDP2 shards the model after loading it "
        "whole); RSS after: `VmRSS` once the timed update is done. Speed-up: against 1 x 1.",
        "",
    ]
    payload = {"command": cmd.strip(), "args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    if args.no_write:
        print("\n".join(lines))
        return
    from benchmarks.perf._child import write_results

    write_results(args.out, lines, payload)


if __name__ == "__main__":
    main()
