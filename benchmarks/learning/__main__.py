"""Does training help? The calc agent on SmolLM2-135M: held-out success before vs after, per seed.

    python -m benchmarks.learning --seeds 0 1 2           # ~10 minutes a seed on a 2-core CPU
    python -m benchmarks.learning --modes sync async      # the same seeds alternating vs rollouts ahead

With ``--modes sync async`` each seed is trained twice, alternating and with asynchronous rollouts
(``--async-rollouts``, staleness bound ``--max-staleness``, default 1), and the comparison goes to
``benchmarks/learning/async_results.md`` with one plot of the training reward per step.

Each seed is a separate, seeded run of ``examples/quickstart.py`` (fresh adapter, its own train tasks,
its own held-out tasks). Writes ``benchmarks/learning/results.md`` (per-seed table, mean gain with a
95% interval over seeds, pooled before/after with Wilson intervals) and one reward curve per seed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "examples"))

import quickstart  # noqa: E402

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``k / n``."""
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--eval-size", type=int, default=32)
    ap.add_argument("--work-dir", default="runs/learning")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--modes", nargs="+", choices=["sync", "async"], default=["sync"])
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=4, help="tasks per step (the demo's: 4)")
    args = ap.parse_args()
    if args.modes != ["sync"]:
        compare_modes(args)
        return
    args.out = args.out or HERE / "results.md"

    rows = []
    for seed in args.seeds:
        out_dir = Path(args.work_dir) / f"seed{seed}"
        shutil.rmtree(out_dir, ignore_errors=True)
        res = quickstart.main(
            [
                "--seed",
                str(seed),
                "--steps",
                str(args.steps),
                "--eval-size",
                str(args.eval_size),
                "--output-dir",
                str(out_dir),
            ]
        )
        curve = HERE / f"reward_curve_seed{seed}.png"
        shutil.copy(res["reward_curve"], curve)
        rows.append({**res, "curve": curve.name})

    n = args.eval_size
    deltas = [r["after"]["success_rate"] - r["before"]["success_rate"] for r in rows]
    mean_d = statistics.fmean(deltas)
    half = (
        T95.get(len(deltas) - 1, 1.96) * statistics.stdev(deltas) / math.sqrt(len(deltas))
        if len(deltas) > 1
        else float("nan")
    )
    k_before = sum(round(r["before"]["success_rate"] * n) for r in rows)
    k_after = sum(round(r["after"]["success_rate"] * n) for r in rows)
    total = n * len(rows)
    wb, wa = wilson(k_before, total), wilson(k_after, total)
    lines = [
        "# Learning on CPU: calc agent, SmolLM2-135M, GRPO + LoRA",
        "",
        f"Command: `python -m benchmarks.learning --seeds {' '.join(map(str, args.seeds))} "
        f"--steps {args.steps} --eval-size {n}`  ",
        f"Date: {dt.date.today()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; "
        f"Python {platform.python_version()}.  ",
        "Task: two-digit additions; the agent (`examples/calc_agent.py`) offers a calculator tool and "
        "is rewarded 1.0 when its final number is right. Held-out tasks are drawn with a different seed "
        "than training tasks. Success is measured greedily (temperature 0) before and after training; "
        "training samples at temperature 1.",
        "",
        "| seed | held-out success before | after | change | train reward, first step -> last | wall time |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r, d in zip(rows, deltas, strict=True):
        rw = _curve(r)
        lines.append(
            f"| {r['seed']} | {r['before']['success_rate']:.1%} | {r['after']['success_rate']:.1%} | "
            f"{d:+.1%} | {rw[0]:.2f} -> {rw[-1]:.2f} | {r['wall_s'] / 60:.1f} min |"
        )
    lines += [
        "",
        f"Mean change over {len(rows)} seeds: **{mean_d:+.1%}** (95% t-interval over seeds: "
        f"{mean_d - half:+.1%} to {mean_d + half:+.1%}).  ",
        f"Pooled held-out success: before {k_before}/{total} = {k_before / total:.1%} "
        f"(Wilson 95%: {wb[0]:.1%}-{wb[1]:.1%}); after {k_after}/{total} = {k_after / total:.1%} "
        f"(Wilson 95%: {wa[0]:.1%}-{wa[1]:.1%}).",
        "",
        *[f"![seed {r['seed']}]({r['curve']})" for r in rows],
        "",
    ]
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


def _curve(run: dict, key: str = "train/reward_mean") -> list[float]:
    lines = (Path(run["store"]).parent / "metrics.jsonl").read_text().splitlines()
    return [m[key] for m in map(json.loads, lines) if key in m]


def compare_modes(args: argparse.Namespace) -> None:
    """Each seed alternating and asynchronous, one after the other on the same machine."""
    runs: dict[tuple[int, str], dict] = {}
    for seed in args.seeds:
        for mode in args.modes:
            out_dir = Path(args.work_dir) / f"{mode}-seed{seed}"
            shutil.rmtree(out_dir, ignore_errors=True)
            argv = ["--seed", str(seed), "--steps", str(args.steps), "--eval-size", str(args.eval_size)]
            argv += ["--batch-size", str(args.batch_size)]
            argv += ["--output-dir", str(out_dir), "--json", str(out_dir.parent / f"{mode}-seed{seed}.json")]
            if mode == "async":
                argv += ["--async-rollouts", "--max-staleness", str(args.max_staleness)]
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            runs[seed, mode] = quickstart.main(argv)
    n = args.eval_size
    k = args.max_staleness
    lines = [
        f"# Learning, alternating vs asynchronous rollouts (max_staleness={k}): calc agent, SmolLM2-135M",
        "",
        f"Command: `python -m benchmarks.learning --modes {' '.join(args.modes)} --seeds "
        f"{' '.join(map(str, args.seeds))} --steps {args.steps} --eval-size {n} --max-staleness {k} "
        f"--batch-size {args.batch_size}`  ",
        f"Date: {dt.date.today()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores, no GPU; "
        f"Python {platform.python_version()}; load average at the end "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.  ",
        "Each seed is `examples/quickstart.py` (the README's `make demo`) with `--seed N`, once as is "
        f"(alternating) and once with `--async-rollouts --max-staleness {k}`: the same training tasks "
        f"({args.batch_size} a step x 8 rollouts each), the same number of updates ({args.steps}), the same "
        f"{n} held-out tasks, measured greedily.",
        "",
        "| seed | held-out before | after, sync | after, async | async - sync | train reward per step, sync "
        "| train reward per step, async | staleness mean (async) | dropped stale (async) | wall, sync "
        "| wall, async |",
        "|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    diffs = []
    for seed in args.seeds:
        s, a = runs[seed, "sync"], runs[seed, "async"]
        d = a["after"]["success_rate"] - s["after"]["success_rate"]
        diffs.append(d)
        stale = _curve(a, "async/staleness_mean")
        dropped = sum(_curve(a, "async/dropped_stale"))
        lines.append(
            f"| {seed} | {s['before']['success_rate']:.1%} | {s['after']['success_rate']:.1%} | "
            f"{a['after']['success_rate']:.1%} | {d:+.1%} | "
            f"{' '.join(f'{x:.2f}' for x in _curve(s))} | {' '.join(f'{x:.2f}' for x in _curve(a))} | "
            f"{statistics.fmean(stale) if stale else float('nan'):.2f} | {dropped:.0f} | "
            f"{s['wall_s'] / 60:.1f} min | {a['wall_s'] / 60:.1f} min |"
        )
    mean_d = statistics.fmean(diffs)
    half = (
        T95.get(len(diffs) - 1, 1.96) * statistics.stdev(diffs) / math.sqrt(len(diffs))
        if len(diffs) > 1 and statistics.stdev(diffs) > 0
        else 0.0
    )
    ks = sum(round(runs[x, "sync"]["after"]["success_rate"] * n) for x in args.seeds)
    ka = sum(round(runs[x, "async"]["after"]["success_rate"] * n) for x in args.seeds)
    total = n * len(args.seeds)
    ws, wa = wilson(ks, total), wilson(ka, total)
    lines += [
        "",
        f"Mean held-out difference, async - sync, over {len(diffs)} seeds: **{mean_d:+.1%}** "
        f"(95% t-interval over seeds: {mean_d - half:+.1%} to {mean_d + half:+.1%}).  ",
        f"Pooled held-out success after training: sync {ks}/{total} = {ks / total:.1%} (Wilson 95%: "
        f"{ws[0]:.1%}-{ws[1]:.1%}); async {ka}/{total} = {ka / total:.1%} (Wilson 95%: "
        f"{wa[0]:.1%}-{wa[1]:.1%}).",
        "",
        "![training reward per step](async_reward_curves.png)",
        "",
    ]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(args.seeds), figsize=(4 * len(args.seeds), 3), squeeze=False)
        for ax, seed in zip(axes[0], args.seeds, strict=True):
            for mode, style in (("sync", "o-"), ("async", "s--")):
                c = _curve(runs[seed, mode])
                ax.plot(range(1, len(c) + 1), c, style, label=mode)
            ax.set_title(f"seed {seed}")
            ax.set_xlabel("update")
            ax.set_xticks(range(1, args.steps + 1))
            ax.set_ylim(0, 1.05)
        axes[0][0].set_ylabel("train reward (mean)")
        axes[0][0].legend()
        fig.tight_layout()
        fig.savefig(HERE / "async_reward_curves.png", dpi=100)
    except ImportError:
        lines[-3] = "(matplotlib missing: no plot)"
    out = args.out or HERE / "async_results.md"
    out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
