"""APO alone, GRPO alone, APO then GRPO, at the same number of training rollouts.

    python -m benchmarks.apo.bench_apo --tasks demo --rollouts 128 --seeds 0 1 2 --held-out 64 --bf16
    python -m benchmarks.apo.bench_apo --tasks calc_x --data-dir /work/shared/data --rollouts 64 --seeds 0
    python -m benchmarks.apo.bench_apo --tasks demo ... --reflection-base-url https://api.openai.com/v1 \\
        --reflection-model gpt-4.1-mini        # a stronger reflection model (key: $OPENAI_API_KEY)

Each arm starts from the same policy (the embedded SmolLM2-135M on CPU by default, which is also the
reflection model unless one is given) and may spend ``--rollouts`` rollouts on training tasks:

- ``grpo``: ``rollouts // (group_size * batch_size)`` GRPO steps;
- ``apo``: ``agl.APO`` with a budget that cannot take it past ``--rollouts`` (GEPA checks its budget
  between iterations, so the budget is ``rollouts - 1 - (2 * minibatch + apo_val)``: one probe rollout
  finds the prompt's default, and the last iteration may score a proposal on its minibatch and then on
  the whole APO validation set);
- ``apo+grpo``: APO with half of the rollouts, then GRPO steps with what APO left.

The held-out success rate (greedy decoding, ``--held-out`` tasks never trained on) is measured before
(once per seed: the arms start from the same policy and prompt) and after. APO scores its candidates on
the first ``--apo-val`` training tasks, never on held-out ones. The agents are ``examples/calc_agent.py``
(demo: two-digit sums with a ``<calc>`` calculator) and the Calc-X AutoGen agent
(``benchmarks/calc_x/autogen_agent.py``); both read their system prompt with ``llm.prompt("system",
default=...)``. Results: a table on stdout, ``--results`` (.md and .json; rows of earlier invocations for
other tasks are kept), a PNG of held-out success per arm.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.rl.config import RolloutConfig

ARMS = ("apo", "grpo", "apo+grpo")
ROOT = Path(__file__).resolve().parents[2]


# -- tasks and agents ---------------------------------------------------------------------------
def setup(args: argparse.Namespace, seed: int) -> dict[str, Any]:
    """Training tasks, held-out tasks, the sampling (training) and greedy (APO, evaluation) agents,
    and the trainer options of ``args.tasks``."""
    if args.tasks == "demo":
        sys.path.insert(0, str(ROOT / "examples"))
        from calc_agent import calc_agent, make_tasks  # type: ignore[import-not-found]

        def greedy(task: Any, llm: agl.LLM) -> float:
            return float(calc_agent(task, llm, temperature=0.0))

        return {
            "train": make_tasks(args.train_size, seed=1000 + seed),
            "held_out": make_tasks(args.held_out, seed=seed),
            "train_agent": calc_agent,
            "greedy_agent": greedy,
            "options": {
                "air": [agl.air.ToolStatus(success=0.1, error=-0.1)],
                "credit": agl.credit.Discounted(1.0),
                "lora": agl.LoRA(r=16, alpha=32),
            },
            "grpo": {"lr": 2e-4, "micro_batch_size": 16},
        }
    if args.tasks == "calc_x":
        from benchmarks.calc_x.autogen_agent import AIR, CREDIT, make_agent
        from benchmarks.calc_x.data import load_dataset, select

        train = select(load_dataset("train", args.data_dir), args.train_size, args.calc_x_train_select)
        return {
            "train": train,
            "held_out": select(load_dataset("test", args.data_dir), args.held_out, "easiest"),
            "train_agent": make_agent(temperature=1.0),
            "greedy_agent": make_agent(temperature=0.0),
            "options": {"air": AIR, "credit": CREDIT, "lora": agl.LoRA(r=16, alpha=32)},
            "grpo": {"lr": 2e-4},
        }
    raise ValueError(f"--tasks is 'demo' or 'calc_x', got {args.tasks!r}")


def _digest(tasks: list[Any]) -> str:
    return hashlib.sha256(json.dumps(tasks, sort_keys=True, default=str).encode()).hexdigest()[:12]


def apo_budget(arm: str, args: argparse.Namespace) -> int:
    """The APO budget of ``arm``: its share of ``--rollouts`` less the probe and the worst overrun."""
    share = args.rollouts if arm == "apo" else args.rollouts // 2 if arm == "apo+grpo" else 0
    if not share:
        return 0
    budget = share - 1 - (2 * args.minibatch_size + args.apo_val)
    if budget < args.apo_val:
        raise SystemExit(
            f"--rollouts {args.rollouts} leaves arm {arm} an APO budget of {budget}, less than the "
            f"{args.apo_val} evaluations of its seed candidate (--apo-val): raise --rollouts"
        )
    return budget


def _reflection(args: argparse.Namespace) -> Any:
    if not args.reflection_base_url:
        return "policy"
    key = args.api_key or os.environ.get("AGL_REFLECTION_API_KEY") or os.environ.get("OPENAI_API_KEY")
    return agl.LLM(
        base_url=args.reflection_base_url, model=args.reflection_model, api_key=key or "agl-no-key"
    )


# -- one arm ------------------------------------------------------------------------------------
def run_arm(
    arm: str, setup_: dict[str, Any], args: argparse.Namespace, seed: int, before: dict | None
) -> dict:
    """One arm on one seed: at most ``args.rollouts`` training rollouts, then the held-out score."""
    out = Path(args.output_dir) / args.tasks / f"{arm.replace('+', '-then-')}-seed{seed}"
    shutil.rmtree(out, ignore_errors=True)
    group, batch = args.group_size, args.batch_size
    budget = apo_budget(arm, args)
    engine_options = {"autocast": "bfloat16"} if args.bf16 else {}
    t0 = time.time()
    row: dict[str, Any] = {"task": args.tasks, "arm": arm, "seed": seed, "apo_budget": budget}
    with agl.Trainer(
        model=args.model,
        output_dir=out,
        seed=seed,
        batch_size=batch,
        algorithm=agl.GRPO(group_size=group, **setup_["grpo"]),
        engine_options=engine_options,
        rollout_config=RolloutConfig(timeout=args.rollout_timeout),
        **setup_["options"],
    ) as trainer:
        store = trainer.store
        if before is None:
            before = trainer.evaluate(setup_["greedy_agent"], setup_["held_out"])
            row["before_measured_here"] = True
        n_eval = _task_rollouts(store)
        apo_spent = 0
        if budget:
            apo = agl.APO(
                _reflection(args),
                budget,
                seed=seed,
                minibatch_size=args.minibatch_size,
                reflection_options={"max_tokens": args.reflection_max_tokens},
            )
            res = trainer.fit(
                setup_["greedy_agent"],
                setup_["train"],
                val_dataset=setup_["train"][: args.apo_val],
                algorithm=apo,
            )
            apo_spent = _task_rollouts(store) - n_eval
            row.update(
                apo_rollouts=apo_spent,
                apo_seed_val=res["apo/seed_val_score"],
                apo_best_val=res["apo/best_val_score"],
                apo_candidates=int(res["apo/candidates"]),
                apo_reflection_calls=int(res["apo/reflection_calls"]),
                apo_time_s=round(res["apo/time_s"], 1),
                prompts=res["prompts"],
                prompt_changed=res["prompts"] != _seed_prompts(out),
                apo_proposals=_proposals(out),
            )
        steps = (args.rollouts - apo_spent) // (group * batch) if arm != "apo" else 0
        if steps:
            n0 = _task_rollouts(store)
            t_grpo = time.time()
            trainer.fit(
                setup_["train_agent"],
                setup_["train"],
                steps=trainer.step + steps,
                algorithm=agl.GRPO(group_size=group, **setup_["grpo"]),
            )
            row.update(
                grpo_steps=steps,
                grpo_rollouts=_task_rollouts(store) - n0,
                grpo_time_s=round(time.time() - t_grpo, 1),
            )
        row["train_rollouts"] = _task_rollouts(store) - n_eval
        after = trainer.evaluate(setup_["greedy_agent"], setup_["held_out"])
    row.update(before=before, after=after, wall_s=round(time.time() - t0, 1), output_dir=str(out))
    return row


def _task_rollouts(store: Any) -> int:
    """Rollouts of tasks in ``store``: not the ``trace`` rollouts that the reflection model's calls to
    the policy's server (``reflection="policy"``) are recorded as."""
    return sum(1 for r in store.rollouts() if r.mode != "trace")


def _proposals(out: Path) -> list[dict[str, Any]]:
    """What the reflection model proposed in the last APO run in ``out`` and how each fared."""
    try:
        run = json.loads((out / "apo" / "latest.json").read_text())["run"]
        rows = [json.loads(x) for x in (out / "apo" / run / "candidates.jsonl").read_text().splitlines()]
    except (OSError, ValueError, KeyError):
        return []
    return [
        {
            "accepted": r.get("accepted"),
            "minibatch": [r.get("parent_minibatch_score"), r.get("minibatch_score")],
            "val_score": r.get("val_score"),
            "prompts": {k: v[:300] for k, v in (r.get("prompts") or {}).items()},
        }
        for r in rows
        if r.get("parent") is not None
    ]


def _seed_prompts(out: Path) -> dict[str, str]:
    """The starting texts of the last APO run in ``out`` (its ``state.json``)."""
    latest = out / "apo" / "latest.json"
    try:
        run = json.loads(latest.read_text())
        run_id = run.get("run") or run.get("run_id")
        state = json.loads((out / "apo" / str(run_id) / "state.json").read_text())
        return dict(state.get("seed_candidate") or {})
    except (OSError, ValueError, AttributeError):
        return {}


# -- results ------------------------------------------------------------------------------------
def machine() -> str:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}"


def _mean_ci(xs: list[float]) -> str:
    if not xs:
        return ""
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    m, sd = statistics.fmean(xs), statistics.stdev(xs)
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78}.get(len(xs), 2.0)
    return f"{m:.3f} ± {t * sd / len(xs) ** 0.5:.3f}"


def _rate(ev: dict[str, Any]) -> str:
    return f"{ev['success_rate']:.3f} ({round(ev['success_rate'] * ev['n'])}/{ev['n']})"


def render(doc: dict[str, Any]) -> str:
    """results.md: per task, a row per arm x seed, the mean per arm, the best prompts APO found."""
    lines = ["# APO, GRPO and APO then GRPO at equal training rollouts", ""]
    for inv in doc["invocations"]:
        lines += [
            f"- `{inv['command']}`",
            f"  - started {inv['started']}, finished {inv.get('finished', '(did not finish)')}; "
            f"{inv['machine']}; reflection model: {inv.get('reflection', '?')}; "
            f"load average at start {inv['load_start']}, at end {inv.get('load_end', '-')}",
        ]
    lines += [f"- {note}" for note in doc.get("notes", [])]
    for task in sorted({r["task"] for r in doc["rows"]}):
        rows = [r for r in doc["rows"] if r["task"] == task]
        lines += [
            "",
            f"## {task}",
            "",
            "| arm | seed | held-out before | after | training rollouts (APO + GRPO) | GRPO steps | "
            "APO val: seed -> best | APO candidates | reflection calls | prompt changed | wall s |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in sorted(rows, key=lambda r: (ARMS.index(r["arm"]), r["seed"])):
            b, a = r["before"], r["after"]
            apo_val = f"{r['apo_seed_val']:.3f} -> {r['apo_best_val']:.3f}" if "apo_best_val" in r else ""
            changed = "" if "prompt_changed" not in r else "yes" if r["prompt_changed"] else "no"
            lines.append(
                f"| {r['arm']} | {r['seed']} | {_rate(b)} | {_rate(a)} "
                f"| {r['train_rollouts']} ({r.get('apo_rollouts', 0)} + {r.get('grpo_rollouts', 0)}) "
                f"| {r.get('grpo_steps', 0)} | {apo_val} | {r.get('apo_candidates', '')} "
                f"| {r.get('apo_reflection_calls', '')} | {changed} | {r['wall_s']} |"
            )
        lines += [
            "",
            "| arm | seeds | held-out before (mean ± 95% t) | after | after - before |",
            "|---|---|---|---|---|",
        ]
        for arm in ARMS:
            sel = [r for r in rows if r["arm"] == arm]
            if not sel:
                continue
            bs = [r["before"]["success_rate"] for r in sel]
            as_ = [r["after"]["success_rate"] for r in sel]
            d = [x - y for x, y in zip(as_, bs, strict=True)]
            seeds = ", ".join(str(r["seed"]) for r in sel)
            lines.append(f"| {arm} | {seeds} | {_mean_ci(bs)} | {_mean_ci(as_)} | {_mean_ci(d)} |")
        best = [r for r in rows if r.get("prompts")]
        if best:
            lines += ["", "Best prompts APO found (on its validation tasks), per arm and seed:", ""]
            for r in sorted(best, key=lambda r: (r["seed"], r["arm"])):
                for k, v in sorted(r["prompts"].items()):
                    changed = "changed" if r.get("prompt_changed") else "unchanged (the seed prompt)"
                    lines.append(f"- {r['arm']}, seed {r['seed']}, `{k}` ({changed}): `{v!r}`")
                props = r.get("apo_proposals") or []
                accepted = sum(bool(p["accepted"]) for p in props)
                lines.append(f"  - {len(props)} proposals, {accepted} accepted; the first ones:")
                for p in props[:3]:
                    text = " ".join(" | ".join(p["prompts"].values()).split())[:160]
                    score = f"minibatch {p['minibatch'][0]} -> {p['minibatch'][1]}"
                    lines.append(f"    - {score}{', accepted' if p['accepted'] else ''}: `{text!r}`")
    return "\n".join(lines) + "\n"


def plot(doc: dict[str, Any], path: Path) -> Path | None:
    """Held-out success before/after per arm (mean over seeds, one point per seed), one panel per task."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    tasks = sorted({r["task"] for r in doc["rows"]})
    if not tasks:
        return None
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    for ax, task in zip(axes[0], tasks, strict=True):
        rows = [r for r in doc["rows"] if r["task"] == task]
        arms = [a for a in ARMS if any(r["arm"] == a for r in rows)]
        for i, arm in enumerate(arms):
            sel = [r for r in rows if r["arm"] == arm]
            for j, key in enumerate(("before", "after")):
                ys = [r[key]["success_rate"] for r in sel]
                x = i * 3 + j
                ax.bar(x, statistics.fmean(ys), color=("#bbbbbb", "#4c72b0")[j], width=0.9)
                ax.scatter([x] * len(ys), ys, color="black", s=10, zorder=3)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(arms))], arms)
        ax.set_ylim(0.0, 1.0)  # one scale for every task: a small change looks small
        ax.set_ylabel("held-out success (grey: before, blue: after)")
        ax.set_title(task)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write(doc: dict[str, Any], results: Path) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    results.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    results.with_suffix(".md").write_text(render(doc))
    plot(doc, results.with_suffix(".png"))


def _load(results: Path) -> dict[str, Any]:
    try:
        return json.loads(results.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {"invocations": [], "rows": []}


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", choices=("demo", "calc_x"), default="demo")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--rollouts", type=int, default=128, help="training rollouts per arm")
    ap.add_argument("--train-size", type=int, default=64)
    ap.add_argument("--held-out", type=int, default=64)
    ap.add_argument("--apo-val", type=int, default=16, help="training tasks APO scores candidates on")
    ap.add_argument("--minibatch-size", type=int, default=3, help="APO's reflection minibatch")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--bf16", action="store_true", help="generation and updates under bf16 autocast (CPU)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--rollout-timeout", type=float, default=1800.0)
    ap.add_argument("--data-dir", default=None, help="Calc-X: directory of calcx_agentlightning_*.jsonl")
    ap.add_argument(
        "--calc-x-train-select", default="english", help="Calc-X training questions (data.select)"
    )
    ap.add_argument(
        "--reflection-base-url", default=None, help="OpenAI-compatible endpoint; default: the policy"
    )
    ap.add_argument("--reflection-model", default=None)
    ap.add_argument("--api-key", default=None, help="default: $AGL_REFLECTION_API_KEY or $OPENAI_API_KEY")
    ap.add_argument("--reflection-max-tokens", type=int, default=384, help="per reflection answer")
    ap.add_argument("--output-dir", default="runs/bench_apo")
    ap.add_argument("--results", type=Path, default=Path(__file__).with_name("results.md"))
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="run nothing: add these results .json files (of runs written elsewhere) to --results",
    )
    args = ap.parse_args(argv)
    if args.merge:
        merged = _load(args.results)
        for path in args.merge:
            other = json.loads(path.read_text())
            merged["invocations"] += other["invocations"]
            keys = {(r["task"], r["arm"], r["seed"]) for r in other["rows"]}
            merged["rows"] = [r for r in merged["rows"] if (r["task"], r["arm"], r["seed"]) not in keys]
            merged["rows"] += other["rows"]
        write(merged, args.results)
        return merged["rows"]
    if args.reflection_base_url and not args.reflection_model:
        ap.error("--reflection-base-url needs --reflection-model")
    for arm in args.arms:
        apo_budget(arm, args)  # refuse a budget too small before loading anything
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    doc = _load(args.results)
    cmd = "python -m benchmarks.apo.bench_apo " + shlex.join(sys.argv[1:] if argv is None else argv)
    inv = {
        "command": cmd,
        "started": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "reflection": args.reflection_model or "the policy (" + args.model + ")",
    }
    doc["invocations"].append(inv)
    rows: list[dict] = []
    befores: dict[str, dict] = {}
    for seed in args.seeds:
        s = setup(args, seed)
        for arm in args.arms:
            key = _digest(s["held_out"])
            row = run_arm(arm, s, args, seed, befores.get(key))
            befores.setdefault(key, row["before"])
            rows.append(row)
            # a later row of the same task, arm and seed replaces an earlier one
            doc["rows"] = [
                r for r in doc["rows"] if (r["task"], r["arm"], r["seed"]) != (row["task"], arm, seed)
            ] + [row]
            inv["load_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
            write(doc, args.results)
            log(
                f"[{args.tasks}] {arm:9s} seed {seed}: held-out {row['before']['success_rate']:.3f} -> "
                f"{row['after']['success_rate']:.3f}; {row['train_rollouts']} training rollouts; "
                f"{row['wall_s']:.0f} s"
            )
    inv["finished"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    write(doc, args.results)
    log(args.results.with_suffix(".md").read_text())
    return rows


if __name__ == "__main__":
    main()
