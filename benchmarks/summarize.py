"""Summarise the warm-start runs of a benchmark over seeds: means, 95% intervals, the AIR ablation plot.

Reads ``benchmarks/<name>/results/results_sft_seed*.json`` (written by ``--sft-tasks N``), writes
``benchmarks/<name>/results/summary.md`` and, when the runs hold an AIR ablation, ``air_ablation.png``
(mean training reward per GRPO step, AIR on and off, one line per seed and their mean)::

    python -m benchmarks.summarize calc_x
    python -m benchmarks.summarize calc_x --tag english   # a variant's runs (--results-tag english)

>>> round(t_interval([0.5, 0.6, 0.7])[1], 3)
0.248
>>> [round(x, 3) for x in wilson(32, 64)]
[0.381, 0.619]
>>> sign_test([0, 0, 0, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0])
(6, 0, 0.03125)
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
#: two-sided 97.5% quantiles of Student's t by degrees of freedom
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% Student-t interval over ``values`` (seeds); nan width for one."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    t = _T975.get(len(values) - 1, 1.96)
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def wilson(successes: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a success rate (``successes`` of ``n``)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    d = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return centre - half, centre + half


def sign_test(before: Sequence[float | None], after: Sequence[float | None]) -> tuple[int, int, float]:
    """Paired exact sign test on the same tasks: ``(improved, worsened, two-sided p)``.

    Ties and tasks without a score on either side are dropped; with 0/1 rewards this is the exact
    McNemar test. Before and after are the same held-out tasks, so pairing removes the variance of
    which tasks happen to be easy.
    """
    up = sum(1 for b, a in zip(before, after, strict=True) if b is not None and a is not None and a > b)
    down = sum(1 for b, a in zip(before, after, strict=True) if b is not None and a is not None and a < b)
    return up, down, _binomial_two_sided(up, up + down)


def _binomial_two_sided(up: int, n: int) -> float:
    """Exact two-sided p of ``up`` successes in ``n`` fair coin flips (1.0 for none).

    >>> _binomial_two_sided(63, 100) < 0.05 < _binomial_two_sided(6, 10)
    True
    """
    if n == 0:
        return 1.0
    k = min(up, n - up)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def _per_task_mean(runs: Sequence[dict[str, Any]]) -> list[float | None] | None:
    """Each task's reward averaged over seeds (``None`` where a seed lacks it)."""
    lists = [r.get("per_task") for r in runs]
    if not lists or any(not x for x in lists):
        return None
    out: list[float | None] = []
    for vals in zip(*lists, strict=True):
        out.append(None if any(v is None for v in vals) else statistics.fmean(vals))
    return out


def _setup(command: str) -> str:
    """A run's command without its ``--seed``, ``--output-dir`` and ``--results-tag`` (what must match
    across seeds).

    >>> _setup("python -m benchmarks.calc_x --steps 2 --seed 1 --output-dir runs/x --results-tag a")
    'python -m benchmarks.calc_x --steps 2'
    """
    words = command.split()
    out, skip = [], False
    for w in words:
        if skip:
            skip = False
            continue
        if w in ("--seed", "--output-dir", "--results-tag"):
            skip = True
            continue
        out.append(w)
    return " ".join(out)


def _curve(run: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The GRPO steps' metric rows: stored in the results, else read from the run's metrics.jsonl."""
    if run.get("curve"):
        return run["curve"]
    path = Path(run.get("output_dir", "")) / "metrics.jsonl"
    if not path.is_file():
        return None
    skip = int((run.get("sft") or {}).get("steps", 0))
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("step", 0) > skip and "train/reward_mean" in r] or None


def load(name: str, tag: str = "") -> list[list[dict[str, Any]]]:
    """Each seed's runs, in seed order: [AIR on] or [AIR on, AIR off] (one process with
    ``--air-ablation``, or a second one with ``--no-air`` whose results file ends in ``_air_off``).
    ``tag``: a variant's files (``--results-tag``), ``results_<tag>_sft_seed*.json``."""
    folder = ROOT / name / "results"
    out = []
    for f in sorted(folder.glob(f"results{_prefix(tag)}_sft_seed*.json")):
        if f.stem.endswith("_air_off"):
            continue
        runs = json.loads(f.read_text())
        off = f.with_name(f.stem + "_air_off.json")
        if len(runs) == 1 and off.is_file():
            runs = runs + json.loads(off.read_text())
        for run in runs:
            run["curve"] = _curve(run)
        out.append(runs)
    return out


def _prefix(tag: str) -> str:
    return f"_{tag}" if tag else ""


def _cell(values: list[float], n_tasks: int, rate: bool = False, fmt: str = "{:.3f}") -> str:
    """Mean ± t-interval over seeds; for a success rate also the Wilson interval of the pooled episodes."""
    mean, half = t_interval(values)
    each = ", ".join(fmt.format(v) for v in values)
    pooled = ""
    if rate:
        k, n = round(sum(values) * n_tasks), n_tasks * len(values)
        lo, hi = wilson(k, n)
        pooled = f"; pooled {k}/{n}, Wilson 95% [{lo:.3f}, {hi:.3f}]"
    if len(values) < 2:
        return f"{fmt.format(mean)} (one seed{pooled})"
    return f"{fmt.format(mean)} ± {fmt.format(half)} (seeds: {each}{pooled})"


def summarize(name: str, metric: str = "success_rate", extra: Sequence[str] = (), tag: str = "") -> str:
    """The Markdown summary of ``name``'s warm-start runs (and the AIR plot, when there is one), written
    to ``summary.md`` (``summary_<tag>.md`` for a tagged variant's runs)."""
    seeds = load(name, tag)
    if not seeds:
        raise SystemExit(f"no results{_prefix(tag)}_sft_seed*.json under benchmarks/{name}/results")
    ablation = any(len(s) > 1 for s in seeds)
    first = seeds[0][0]
    setups = {_setup(s[0]["command"]) for s in seeds}
    if len(setups) > 1:
        raise SystemExit(
            f"benchmarks/{name}/results holds runs of different set-ups (not only --seed/--output-dir "
            f"differ): {sorted(setups)}; move the old results_sft_seed*.json away first"
        )
    n = int(first["test_size"])
    lines = [
        f"# {name}: warm start (SFT on teacher traces) and GRPO, held-out results over seeds",
        "",
        f"Held-out tasks: {n} (never trained on), greedy decoding; seeds "
        f"{', '.join(str(s[0]['seed']) for s in seeds)}; model {first['model']}; {first['hardware']}.",
        f"Warm start: `agl.SFT` on the teacher's successful runs of {first['sft']['tasks']} training tasks "
        f"({first['sft']['calls']} calls); then GRPO, {first['steps']} steps x {first['batch_size']} tasks x "
        f"group {first['group_size']}. Means ± the half-width of the 95% Student-t interval over seeds.",
        f"Set-up: {first.get('notes', '')}.",
        "",
        "| measure | before | warm start (SFT) | warm start + GRPO |"
        + (" warm start + GRPO, AIR off |" if ablation else ""),
        "|---|---|---|---|" + ("---|" if ablation else ""),
    ]
    before = first["before"]
    for key in dict.fromkeys([metric, "mean_reward", *extra]):
        if key not in before:
            continue
        warm = [s[0]["warm"][key] for s in seeds]
        on = [s[0]["after"][key] for s in seeds]
        off = [s[1]["after"][key] for s in seeds if len(s) > 1]
        rate = key == metric and metric == "success_rate"  # a 0/1 rate: Wilson intervals apply
        lo, hi = wilson(before[key] * n, n) if rate else (float("nan"), float("nan"))
        b = f"{before[key]:.3f}" + (f" (Wilson 95% [{lo:.3f}, {hi:.3f}])" if rate else "")
        off_cell = _cell(off, n, rate) + f" ({len(off)} seeds)" if off else "not run"
        row = f"| {key} | {b} | {_cell(warm, n, rate)} | {_cell(on, n, rate)} |"
        lines.append(row + (f" {off_cell} |" if ablation else ""))
    own = [s for s in seeds if len(s) > 1 and s[1].get("warm") and s[1]["warm"] != s[0]["warm"]]
    if own:  # `--no-air` in a process of its own: its warm start was trained and evaluated again
        each = ", ".join(f"{s[1]['warm'][metric]:.3f}" for s in own)
        lines += [
            "",
            f"The AIR-off arm ran in processes of its own (`--no-air`, seeds "
            f"{', '.join(str(s[0]['seed']) for s in own)}): their own warm starts scored {metric} {each}; "
            "the AIR-off comparisons below start from those.",
        ]
    pairs = [("before", "warm start", lambda s: first["before"], lambda s: s[0]["warm"])]
    pairs += [("before", "warm start + GRPO", lambda s: first["before"], lambda s: s[0]["after"])]
    pairs += [("warm start", "warm start + GRPO", lambda s: s[0]["warm"], lambda s: s[0]["after"])]
    if all(len(s) > 1 for s in seeds):
        pairs += [
            (
                "warm start",
                "+ GRPO, AIR off",
                lambda s: s[1].get("warm") or s[0]["warm"],
                lambda s: s[1]["after"],
            )
        ]
        pairs += [("+ GRPO, AIR off", "+ GRPO, AIR on", lambda s: s[1]["after"], lambda s: s[0]["after"])]
    tests = []
    for a_name, b_name, a_of, b_of in pairs:
        a_runs, b_runs = [a_of(s) for s in seeds], [b_of(s) for s in seeds]
        a_mean, b_mean = _per_task_mean(a_runs), _per_task_mean(b_runs)
        if a_mean is None or b_mean is None:
            continue
        cells, ups, downs = [], 0, 0
        for a, b in zip(a_runs, b_runs, strict=True):
            up, down, p = sign_test(a["per_task"], b["per_task"])
            cells.append(f"{up}/{down} (p={p:.3g})")
            ups, downs = ups + up, downs + down
        pooled_p = _binomial_two_sided(ups, ups + downs)
        up, down, p = sign_test(a_mean, b_mean)
        tests.append(
            f"| {a_name} -> {b_name} | {'; '.join(cells)} | {ups}/{downs} (p={pooled_p:.3g}) "
            f"| {up}/{down} (p={p:.3g}) |"
        )
    if tests:
        lines += [
            "",
            "Paired sign test on the same held-out tasks (task reward; with 0/1 rewards the exact McNemar "
            "test): tasks that improved / got worse, two-sided p. Per seed; over every seed's pairs pooled "
            "(the stratified McNemar test: each seed is its own training run); and on each task's reward "
            "averaged over the seeds (which ignores by how much a task changed):",
            "",
            "| comparison | per seed (improved/worse) | seeds' pairs pooled | seeds averaged per task |",
            "|---|---|---|---|",
            *tests,
        ]
    if ablation:
        lines += [
            "",
            "Per seed (wall time is the whole process: warm start, evaluations and both GRPO arms):",
            "",
            "| seed | warm start | + GRPO (AIR on) | + GRPO (AIR off) | SFT s | GRPO s (on / off) | wall "
            "| command |",
            "|---|---|---|---|---|---|---|---|",
        ]
    else:
        lines += [
            "",
            "Per seed (wall time is the whole process: warm start, evaluations and GRPO):",
            "",
            "| seed | warm start | + GRPO | SFT s | GRPO s | wall | command |",
            "|---|---|---|---|---|---|---|",
        ]
    for s in seeds:
        r = s[0]
        off = s[1] if len(s) > 1 else None
        head = f"| {r['seed']} | {r['warm'][metric]:.3f} | {r['after'][metric]:.3f} | "
        tail = f"{r['wall_s'] / 60:.1f} min | `{r['command']}` |"
        if ablation:
            off_after = f"{off['after'][metric]:.3f}" if off else "not run"
            off_s = f"{off['rl_s']:.0f}" if off else "-"
            lines.append(f"{head}{off_after} | {r['sft']['s']:.0f} | {r['rl_s']:.0f} / {off_s} | {tail}")
        else:
            lines.append(f"{head}{r['sft']['s']:.0f} | {r['rl_s']:.0f} | {tail}")
    if any(len(s) > 1 and s[0].get("curve") for s in seeds):
        path = plot_air(name, seeds, tag)
        lines += ["", f"AIR ablation, training reward per GRPO step: [{path.name}]({path.name})", ""]
        lines += ["| seed | arm | train reward per step | groups without reward spread per step | updates |"]
        lines += ["|---|---|---|---|---|"]
        for s in seeds:
            for arm, run in zip(("AIR on", "AIR off"), s, strict=False):
                rows = run.get("curve") or []
                rewards = ", ".join(f"{r.get('train/reward_mean', float('nan')):.3f}" for r in rows)
                zero = ", ".join(
                    f"{r.get('grpo/zero_std_groups', float('nan')):.0f}/{r.get('grpo/groups', 0):.0f}"
                    for r in rows
                )
                done = sum(1 for r in rows if not r.get("train/skipped_update"))
                lines.append(f"| {run['seed']} | {arm} | {rewards} | {zero} | {done} of {len(rows)} |")
    text = "\n".join(lines) + "\n"
    (ROOT / name / "results" / f"summary{_prefix(tag)}.md").write_text(text)
    return text


def plot_air(name: str, seeds: list[list[dict[str, Any]]], tag: str = "") -> Path:
    """Both arms' training reward per GRPO step on one figure: thin lines per seed, thick means."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = [s for s in seeds if len(s) > 1 and s[0].get("curve") and s[1].get("curve")]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for arm, colour in ((0, "tab:blue"), (1, "tab:orange")):
        curves = [[row.get("train/reward_mean", float("nan")) for row in s[arm]["curve"]] for s in seeds]
        label = "AIR on" if arm == 0 else "AIR off"
        for c in curves:
            ax.plot(range(1, len(c) + 1), c, color=colour, alpha=0.3, linewidth=1)
        width = min(len(c) for c in curves)
        mean = [statistics.fmean(c[i] for c in curves) for i in range(width)]
        ax.plot(range(1, width + 1), mean, color=colour, linewidth=2.5, marker="o", label=f"{label} (mean)")
    ax.set_xlabel("GRPO step after the warm start")
    ax.set_ylabel("mean task reward of the step's rollouts")
    ax.set_title(f"{name}: AIR on vs off ({len(seeds)} seeds)")
    ax.legend(loc="best")
    fig.tight_layout()
    path = ROOT / name / "results" / f"air_ablation{_prefix(tag)}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.summarize", description=__doc__.splitlines()[0])
    ap.add_argument("benchmark", choices=("calc_x", "musique", "spider"))
    ap.add_argument("--tag", default="", help="a variant's runs (their --results-tag)")
    args = ap.parse_args(argv)
    extra = {
        "calc_x": ("answer_format", "tool_calls", "tool_errors"),
        "musique": ("f1", "em", "format", "searches", "support_recall"),
        "spider": ("writer_acc", "turns"),
    }[args.benchmark]
    metric = {"musique": "f1"}.get(args.benchmark, "success_rate")
    print(summarize(args.benchmark, metric, extra, tag=args.tag))


if __name__ == "__main__":
    main()
