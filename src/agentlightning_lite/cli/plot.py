"""``agl-lite plot``: draw a run's reward curve as a PNG."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from ..types import Rollout
from ._common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    CLIError,
    print_error,
    reader_parser,
)
from .readstore import open_store


def add_parser(sub: Any) -> None:
    """The ``plot`` sub-command."""
    plot = reader_parser(
        sub,
        "plot",
        "draw the reward curve as a PNG",
        "Draw the reward curve: from metrics.jsonl next to DB (a training run) when there is one, "
        "else from the rollouts' rewards over time.",
    )
    plot.add_argument("--out", default=None, help="the PNG to write (default: DB's name + _reward_curve.png)")
    plot.add_argument(
        "--source",
        choices=("auto", "metrics", "rollouts"),
        default="auto",
        help="auto (default): metrics.jsonl when next to DB, else rollouts",
    )
    plot.add_argument("--metrics", default=None, help="a metrics.jsonl to plot (default: next to DB)")
    plot.add_argument("--mode", choices=("train", "val", "trace"), help="rollouts: only this mode")
    plot.add_argument("--json", action="store_true", help="print {'path': ..., 'source': ..., 'points': N}")


def _rolling(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot(args: argparse.Namespace) -> int:
    """``agl-lite plot DB``: a reward-curve PNG from metrics.jsonl or from the rollouts."""
    store = open_store(args)  # checks that DB exists and is ours, even when metrics are plotted
    try:
        rollouts = store.rollouts(mode=args.mode) if args.source != "metrics" else []
    finally:
        store.close()
    metrics = Path(args.metrics) if args.metrics else store.path.parent / "metrics.jsonl"
    if args.metrics and not metrics.is_file():
        raise CLIError(f"no such file: {metrics}", EXIT_USAGE)
    use_metrics = args.source == "metrics" or (args.source == "auto" and metrics.is_file())
    if args.source == "metrics" and not metrics.is_file():
        raise CLIError(f"no metrics.jsonl next to {args.db} (pass --metrics PATH)", EXIT_USAGE)
    out = Path(args.out) if args.out else store.path.with_name(store.path.stem + "_reward_curve.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CLIError("plot needs matplotlib: pip install matplotlib", EXIT_RUNTIME) from None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if use_metrics:
        rows = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines() if x.strip()]
        series = {
            "train/reward_mean": ("train reward (mean)", "-", "#4C72B0"),
            "val/reward_mean": ("val reward (mean)", "o-", "#DD8452"),
            "val/success_rate": ("val success rate", "s--", "#55A868"),
        }
        points = 0
        for key, (label, fmt, color) in series.items():
            xy = [
                (r["step"], r[key])
                for r in rows
                if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
            ]
            if xy:
                points += len(xy)
                ax.plot(*zip(*xy, strict=True), fmt, label=label, color=color)
        ax.set_xlabel("training step")
        source = str(metrics)
    else:
        done = [r for r in rollouts if r.reward is not None]
        points = len(done)
        if done:
            t0 = min(r.start_time for r in done)
            by_mode: dict[str, list[Rollout]] = {}
            for r in sorted(done, key=lambda r: r.end_time or r.start_time):
                by_mode.setdefault(r.mode, []).append(r)
            colors = {"train": "#4C72B0", "val": "#DD8452", "trace": "#55A868"}
            for mode, items in by_mode.items():
                xs = [((r.end_time or r.start_time) - t0) / 60.0 for r in items]
                ys = [float(r.reward) for r in items]  # type: ignore[arg-type]
                ax.scatter(xs, ys, s=8, alpha=0.3, color=colors.get(mode))
                window = max(1, len(ys) // 20)
                ax.plot(xs, _rolling(ys, window), color=colors.get(mode), label=f"{mode} (mean of {window})")
        ax.set_xlabel("minutes since the first rollout")
        source = "rollouts"
    if points == 0:
        plt.close(fig)
        print_error(f"no rewards to plot in {source if use_metrics else args.db}")
        return EXIT_NOT_FOUND
    ax.set_ylabel("reward")
    ax.set_title(f"reward curve: {store.path.name}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    if args.json:
        print(json.dumps({"path": str(out), "source": source, "points": points}))
    else:
        print(f"wrote {out} ({points} points from {source})")
    return EXIT_OK
