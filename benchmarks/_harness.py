"""What the paper benchmarks share: the command line, base-vs-trained evaluation, results files.

A benchmark package (``benchmarks/spider``, ``benchmarks/musique``, ``benchmarks/calc_x``) provides
its data loader and its agent; :func:`run` does the rest:

1. evaluates the untrained policy on the held-out split (greedy, one rollout per task),
2. trains it with ``agl.Trainer.fit`` on the train split,
3. evaluates again, and writes ``results.json`` and ``reward_curve.png`` into the run's output
   directory, copies both next to the benchmark (``benchmarks/<name>/results/``) and appends one
   row to ``benchmarks/RESULTS.md`` with the exact command, model, seed, hardware and wall time.

An agent may report per-task metrics beyond its reward (exact match, F1, ...) with
:func:`report`; their means appear before and after training in the results.

>>> import argparse
>>> ap = argparse.ArgumentParser()
>>> add_arguments(ap, train_size=8, test_size=8, steps=2)
>>> ns = ap.parse_args(["--steps", "1"])
>>> (ns.model, ns.steps, ns.train_size)
('smollm2-135m', 1, 8)
"""

from __future__ import annotations

import argparse
import contextvars
import datetime as dt
import functools
import inspect
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
RESULTS_MD = ROOT / "RESULTS.md"
#: where tests and this repository's developers keep the offline copies of the data
SHARED_DATA = ROOT.parents[1] / "shared" / "data"

_METRICS: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "agl_bench_metrics", default=None
)


def report(**metrics: float) -> None:
    """Record per-task metrics (``report(em=1.0, f1=0.67)``) from inside a benchmark agent.

    Outside :func:`run`'s evaluation this is a no-op, so agents can call it unconditionally.
    """
    current = _METRICS.get()
    if current is not None:
        current.update({k: float(v) for k, v in metrics.items()})


def add_arguments(
    ap: argparse.ArgumentParser,
    *,
    train_size: int,
    test_size: int,
    steps: int,
    batch_size: int = 4,
    group_size: int = 4,
    lr: float = 2e-4,
    lora_r: int = 16,
    max_tokens: int = 256,
) -> None:
    """The options every benchmark takes, with that benchmark's CPU defaults."""
    ap.add_argument("--model", default="smollm2-135m", help="agl.models name, HF id or local path")
    ap.add_argument("--data-dir", type=Path, default=None, help="the dataset files (default: download)")
    ap.add_argument("--train-size", type=int, default=train_size, help="training tasks")
    ap.add_argument("--test-size", type=int, default=test_size, help="held-out tasks (before/after)")
    ap.add_argument("--steps", type=int, default=steps, help="training steps")
    ap.add_argument("--batch-size", type=int, default=batch_size, help="tasks per step")
    ap.add_argument("--group-size", type=int, default=group_size, help="rollouts per task (GRPO)")
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--lora-r", type=int, default=lora_r)
    ap.add_argument("--max-tokens", type=int, default=max_tokens, help="per model call")
    ap.add_argument("--engine", default="auto", help="auto | hf | vllm")
    ap.add_argument("--load-in-4bit", action="store_true", help="QLoRA (GPU only)")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's); on a CPU shared with other busy processes, 1 avoids "
        "oversubscription and can be several times faster",
    )
    ap.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="vLLM's share of the GPU (default 0.45: the rest holds the training copy)",
    )
    ap.add_argument("--concurrency", type=int, default=None, help="rollouts at once (default: one step's)")
    ap.add_argument("--rollout-timeout", type=float, default=1800.0)
    ap.add_argument(
        "--bf16",
        action="store_true",
        help="bfloat16 autocast over the float32 model, generation and updates alike "
        "(HFEngine(autocast='bfloat16'): the fast path on CPUs with AMX/AVX512-BF16)",
    )
    ap.add_argument(
        "--transitions",
        choices=("call", "trajectory"),
        default="call",
        help="'trajectory': an episode's calls that extend each other are trained as one sequence",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", type=Path, default=None, help="default: runs/<benchmark>")
    ap.add_argument("--no-record", action="store_true", help="do not touch benchmarks/RESULTS.md")
    ap.add_argument(
        "--results-tag",
        default="",
        type=_results_tag,
        help="name a warm-start variant's results files (results_<tag>_sft_seed0.json) so that they sit "
        "beside the default set-up's; `python -m benchmarks.summarize <benchmark> --tag <tag>` reads them",
    )
    ap.add_argument(
        "--sft-tasks",
        type=int,
        default=0,
        help="supervised warm start first: teacher traces (gold solutions through the real agent) on this "
        "many training tasks, disjoint from the held-out ones; 0: no warm start",
    )
    ap.add_argument("--sft-epochs", type=int, default=1, help="passes over each warm-start step's calls")
    ap.add_argument("--sft-lr", type=float, default=5e-4, help="warm-start learning rate")
    ap.add_argument("--sft-batch-size", type=int, default=8, help="teacher tasks per warm-start step")
    ap.add_argument(
        "--rl-on-sft-tasks",
        action="store_true",
        help="GRPO on the warm start's own training tasks (instead of --train-size others): where the base "
        "model never scores, tasks it was shown give GRPO groups with a reward spread",
    )
    ap.add_argument("--no-air", action="store_true", help="train on the final reward only (AIR ablation)")
    ap.add_argument(
        "--air-ablation",
        action="store_true",
        help="after the (shared) warm start, run GRPO twice from the same adapter, seed and steps: with "
        "AIR and without; both held-out results are recorded and both reward curves drawn on one plot",
    )
    ap.add_argument(
        "--before-cache",
        type=Path,
        default=None,
        help="a JSON file holding the untrained policy's held-out scores: read when it exists (the base "
        "model is the same for every seed), else evaluated and written",
    )


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_average() -> str:
    """The 1/5/15-minute load averages, for the record of how busy the machine was."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def hardware() -> str:
    """One line: CPU model and cores, or the GPU."""
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            mem = torch.cuda.get_device_properties(0).total_memory / 2**30
            return f"{name} ({mem:.0f} GiB)"
    except ImportError:  # pragma: no cover - torch is a dependency of training
        pass
    return f"{cpu_model()}, {os.cpu_count()} cores, no GPU"


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _with_metrics(agent: Callable[..., Any], sink: list[dict[str, float]], lock: threading.Lock) -> Any:
    """Wrap ``agent`` so that what it :func:`report`\\ s lands in ``sink`` (one dict per task)."""

    def collect(metrics: dict[str, Any], reward: Any, task: Any) -> None:
        if isinstance(reward, (int, float)):
            metrics.setdefault("reward", float(reward))
        metrics["_task"] = _task_key(task)
        with lock:
            sink.append(metrics)

    if inspect.iscoroutinefunction(agent):

        @functools.wraps(agent)
        async def arun(task: Any, llm: Any) -> Any:
            metrics: dict[str, float] = {}
            token = _METRICS.set(metrics)
            try:
                reward = await agent(task, llm)
            finally:
                _METRICS.reset(token)
            collect(metrics, reward, task)
            return reward

        return arun

    @functools.wraps(agent)
    def run_(task: Any, llm: Any) -> Any:
        metrics: dict[str, float] = {}
        token = _METRICS.set(metrics)
        try:
            reward = agent(task, llm)
        finally:
            _METRICS.reset(token)
        collect(metrics, reward, task)
        return reward

    return run_


def evaluate(trainer: Any, agent: Callable[..., Any], tasks: Sequence[Any]) -> dict[str, Any]:
    """``trainer.evaluate`` plus the means of what the agent :func:`report`\\ ed, and ``per_task``: each
    task's reward in the order of ``tasks`` (``None`` where its rollout failed), for paired tests."""
    sink: list[dict[str, Any]] = []
    res: dict[str, Any] = dict(trainer.evaluate(_with_metrics(agent, sink, threading.Lock()), tasks))
    keys = sorted({k for m in sink for k in m} - {"reward", "_task"})
    for k in keys:
        vals = [m[k] for m in sink if k in m]
        res[k] = statistics.fmean(vals) if vals else float("nan")
    reward_of = {m["_task"]: m.get("reward") for m in sink}
    res["per_task"] = [reward_of.get(_task_key(t)) for t in tasks]
    return res


def _task_key(task: Any) -> str:
    return json.dumps(task, sort_keys=True, default=str)


def run(
    name: str,
    args: argparse.Namespace,
    *,
    train_agent: Callable[..., Any],
    eval_agent: Callable[..., Any],
    train: Sequence[Any],
    test: Sequence[Any],
    trainer_options: dict[str, Any] | None = None,
    argv: Sequence[str] | None = None,
    notes: str = "",
    variant: str = "",
    teacher: Callable[[Sequence[Any]], Any] | None = None,
    sft_train: Sequence[Any] | None = None,
    sft_agent: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Evaluate, train, evaluate; write and record the results (see the module docstring).

    ``trainer_options`` go to ``agl.Trainer`` (``agents``, ``credit``, ``air``, ``rollout_config``,
    ...) over the defaults built from ``args``. With ``--sft-tasks N`` and a ``teacher`` (tasks ->
    engine replying with their gold solutions), the policy is first fine-tuned with ``agl.SFT`` on
    the teacher's successful runs of ``sft_train[:N]`` (through ``sft_agent``, default
    ``train_agent``), evaluated ("warm"), then trained with GRPO for ``--steps`` steps.
    ``variant`` names the set-up in the results row
    (``"policies separate"``). Returns the results dict that ``results.json`` holds.
    """
    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import RolloutConfig, SampleConfig

    t0 = time.time()
    engine_options: dict[str, Any] = {}
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)  # process-wide: the engine and the update both use it
    if args.gpu_memory_utilization is not None:
        engine_options["gpu_memory_utilization"] = args.gpu_memory_utilization
    if getattr(args, "bf16", False):
        engine_options["autocast"] = "bfloat16"
    out_dir = Path(args.output_dir or Path("runs") / name)
    shutil.rmtree(out_dir, ignore_errors=True)  # a fresh store, metrics and curve for each run
    out_dir.mkdir(parents=True, exist_ok=True)
    concurrency = args.concurrency or max(args.batch_size * args.group_size, 1)
    options: dict[str, Any] = {
        "model": args.model,
        "algorithm": agl.GRPO(group_size=args.group_size, lr=args.lr),
        "lora": agl.LoRA(r=args.lora_r, alpha=2 * args.lora_r, load_in_4bit=args.load_in_4bit),
        "engine": args.engine,
        "engine_options": engine_options,
        "batch_size": args.batch_size,
        "rollout_config": RolloutConfig(concurrency=concurrency, timeout=args.rollout_timeout),
        "output_dir": out_dir,
        "seed": args.seed,
        "sample_config": SampleConfig(transitions=getattr(args, "transitions", "call")),
    }
    options.update(trainer_options or {})
    if getattr(args, "no_air", False):
        options["air"] = None
    sft_n = getattr(args, "sft_tasks", 0) or 0
    if sft_n and (teacher is None or not sft_train):
        raise SystemExit(f"--sft-tasks: benchmark {name} has no teacher")
    if getattr(args, "rl_on_sft_tasks", False):
        if not sft_n or sft_train is None:
            raise SystemExit("--rl-on-sft-tasks needs --sft-tasks")
        train = list(sft_train[:sft_n])
        variant = "; ".join(v for v in (variant, "GRPO on the warm start's tasks") if v)
    print(
        f"[{name}] model {args.model}; {len(train)} train / {len(test)} held-out tasks; "
        f"{args.steps} steps of {args.batch_size} tasks x {args.group_size} rollouts",
        flush=True,
    )
    trainer = agl.Trainer(**options)
    warm: dict[str, Any] | None = None
    sft_stats: dict[str, Any] = {}
    try:
        cache = getattr(args, "before_cache", None)
        cached = json.loads(Path(cache).read_text()) if cache is not None and Path(cache).is_file() else None
        if cached is not None and len(cached.get("per_task") or ()) == len(test):
            before = cached
            print(f"[{name}] before training (from {cache}): {_fmt(before)}", flush=True)
        else:
            before = evaluate(trainer, eval_agent, test)
            print(f"[{name}] before training: {_fmt(before)}", flush=True)
            if cache is not None:
                Path(cache).parent.mkdir(parents=True, exist_ok=True)
                Path(cache).write_text(json.dumps(before, indent=2))
        t_fit = time.time()
        if sft_n:
            assert teacher is not None and sft_train is not None
            tasks = list(sft_train[:sft_n])
            sft = agl.SFT(teacher=teacher(tasks), min_reward=1.0, lr=args.sft_lr, epochs=args.sft_epochs)
            batch = trainer.batch_size
            trainer.batch_size = args.sft_batch_size
            sft_steps = -(-len(tasks) // args.sft_batch_size)
            last = trainer.fit(sft_agent or train_agent, tasks, steps=trainer.step + sft_steps, algorithm=sft)
            trainer.batch_size = batch
            n_calls = agl.export_sft(
                trainer.store, out_dir / "teacher_sft.jsonl", min_reward=1.0, mode="train"
            )
            sft_stats = {"tasks": len(tasks), "steps": sft_steps, "calls": n_calls, "s": 0.0, **last}
            sft_stats["s"] = round(time.time() - t_fit, 1)
            print(f"[{name}] warm start: {n_calls} teacher calls, {sft_stats['s']:.0f} s", flush=True)
            warm = evaluate(trainer, eval_agent, test)
            print(f"[{name}] after the warm start: {_fmt(warm)}", flush=True)
            trainer.save(out_dir / "adapter-warm")
            if args.steps:
                trainer.use_algorithm(options["algorithm"])
        ablation = getattr(args, "air_ablation", False) and args.steps > 0
        start = _snapshot(trainer) if ablation else None
        arms: list[tuple[str, Any]] = [("AIR on", options.get("air")), ("AIR off", None)] if ablation else []
        if ablation:
            trainer.air = list(arms[0][1] or [])
        t_rl = time.time()
        n_rows = len(trainer.metrics.rows())
        if args.steps:
            trainer.fit(train_agent, train, steps=trainer.step + args.steps)
        rl_s = time.time() - t_rl
        fit_s = time.time() - t_fit
        after = evaluate(trainer, eval_agent, test) if (args.steps or warm is None) else dict(warm)
        print(f"[{name}] after {args.steps} steps: {_fmt(after)}", flush=True)
        curves = {arms[0][0]: trainer.metrics.rows()[n_rows:]} if ablation else {}
        other: dict[str, Any] | None = None
        if ablation and start is not None:
            adapter_on = trainer.save(out_dir / "adapter-air-on")
            _restore(trainer, start)  # the same warm-start adapter, data position, step and seeds
            trainer.air = None
            trainer.use_algorithm(_fresh(options["algorithm"]))
            t_off = time.time()
            n_rows = len(trainer.metrics.rows())
            trainer.fit(train_agent, train, steps=trainer.step + args.steps)
            off_rl_s = time.time() - t_off
            after_off = evaluate(trainer, eval_agent, test)
            print(f"[{name}] AIR off, after {args.steps} steps: {_fmt(after_off)}", flush=True)
            curves[arms[1][0]] = trainer.metrics.rows()[n_rows:]
            other = {"after": after_off, "rl_s": round(off_rl_s, 1), "adapter": str(trainer.save())}
            adapter = adapter_on
            curve = plot_curves(curves, out_dir / "air_ablation.png", title=f"{name}: AIR on vs off")
        else:
            if sft_n:
                curves["GRPO"] = trainer.metrics.rows()[n_rows:]
            curve = trainer.plot()
            adapter = trainer.save()
    finally:
        trainer.close()
    wall_s = time.time() - t0
    given = list(argv if argv is not None else sys.argv[1:])
    command = f"python -m benchmarks.{name} {shlex.join(given)}"
    results: dict[str, Any] = {
        "benchmark": name,
        "variant": variant,
        "command": command.strip(),
        "model": args.model,
        "seed": args.seed,
        "train_size": len(train),
        "test_size": len(test),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "lr": args.lr,
        "lora_r": args.lora_r,
        "threads": args.threads,
        "before": before,
        "after": after,
        "warm": warm,
        "sft": sft_stats or None,
        # AIR on / off, for a benchmark that has AIR rules (None: it has none)
        "air": (options.get("air") is not None) if (trainer_options or {}).get("air") else None,
        "train_s": round(fit_s, 1),
        "rl_s": round(rl_s, 1),
        "wall_s": round(wall_s, 1),
        "hardware": hardware(),
        "python": platform.python_version(),
        "commit": _commit(),
        "date": dt.date.today().isoformat(),
        "output_dir": str(out_dir),
        "adapter": str(adapter),
        "notes": notes,
        "results_tag": getattr(args, "results_tag", ""),
    }
    runs = [results]
    if other is None and "GRPO" in curves:
        results["curve"] = curves["GRPO"]
    if other is not None:
        results["variant"] = "; ".join(v for v in (variant, "AIR on") if v)
        results["curve"] = curves.get("AIR on")
        off = {**results, **other, "variant": "; ".join(v for v in (variant, "AIR off") if v), "air": False}
        off["curve"] = curves.get("AIR off")
        off["wall_s"] = results["wall_s"]  # one process ran both arms (shared warm start)
        runs.append(off)
        results["air_off"] = {k: off[k] for k in ("after", "rl_s", "adapter")}
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    if not args.no_record:
        keep = ROOT / name / "results"
        keep.mkdir(parents=True, exist_ok=True)
        tag = _tag(results)
        (keep / f"results{tag}.json").write_text(json.dumps(runs, indent=2, default=str))
        if curve is not None and Path(curve).exists():
            shutil.copy(
                curve, keep / (f"air_ablation{tag}.png" if other is not None else f"reward_curve{tag}.png")
            )
        for r in runs:
            record(r)
    print(json.dumps({k: results[k] for k in ("before", "after", "wall_s")}, indent=2, default=str))
    return results


def _results_tag(text: str) -> str:
    """``--results-tag``'s check, at parse time (not after a long run): a file-name word."""
    if text and not text.replace("-", "").replace("_", "").isalnum():
        raise argparse.ArgumentTypeError(f"letters, digits, '-' and '_' only, got {text!r}")
    return text


def _tag(results: dict[str, Any]) -> str:
    """The results file suffix of a warm-start run (``_sft_seed1``, ``_english_sft_seed1`` with
    ``--results-tag english``); empty for a plain run."""
    if not results.get("sft"):
        return ""
    tag = results.get("results_tag") or ""
    return (
        (f"_{tag}" if tag else "")
        + f"_sft_seed{results['seed']}"
        + ("_air_off" if results.get("air") is False else "")
    )


def _snapshot(trainer: Any) -> dict[str, Any]:
    import torch

    return {
        "lora": {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad},
        "step": trainer.step,
        "position": trainer.data_position,
        "torch": torch.get_rng_state(),
    }


def _restore(trainer: Any, snap: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for n, p in trainer.policy.named_parameters():
            if n in snap["lora"]:
                p.copy_(snap["lora"][n])
    trainer.step, trainer.data_position = snap["step"], snap["position"]
    torch.set_rng_state(snap["torch"])
    rng = getattr(trainer.engine, "_rng", None)  # the HF engine's sampling generator
    if rng is not None:
        rng.manual_seed(trainer.seed)


def _fresh(algorithm: Any) -> Any:
    import dataclasses

    return dataclasses.replace(algorithm)


def plot_curves(curves: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> Path | None:
    """One figure: each run's training reward (and success rate) per step, e.g. AIR on vs off."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, rows in curves.items():
        steps = [i + 1 for i in range(len(rows))]
        ax.plot(steps, [r.get("train/reward_mean", float("nan")) for r in rows], marker="o", label=label)
    ax.set_xlabel("GRPO step (after the warm start)")
    ax.set_ylabel("mean episode reward (training rollouts)")
    ax.set_title(title)
    ax.legend(loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(res: dict[str, Any]) -> str:
    skip = {"n", "failed"}
    parts = [f"{k} {v:.3f}" for k, v in res.items() if k not in skip and isinstance(v, float)]
    return ", ".join(parts) + f" (n={res.get('n')}, failed={res.get('failed')})"


HEADER = (
    "| date | benchmark | model | train / test | steps x tasks x group | before | after | wall | "
    "hardware | seed | command |\n|---|---|---|---|---|---|---|---|---|---|---|\n"
)


def record(results: dict[str, Any], path: Path = RESULTS_MD) -> None:
    """Append one Markdown row to ``benchmarks/RESULTS.md`` (creating the table if needed)."""

    def score(res: dict[str, Any]) -> str:
        known = ("n", "failed", "mean_reward", "success_rate")
        extra = [f"{k} {v:.3f}" for k, v in res.items() if k not in known and isinstance(v, float)]
        return f"reward {res['mean_reward']:.3f}, success {res['success_rate']:.1%}" + "".join(
            f", {e}" for e in extra
        )

    if not path.exists() or "| date | benchmark" not in path.read_text():
        text = path.read_text() if path.exists() else "# Benchmark results\n\n"
        path.write_text(text.rstrip() + "\n\n" + HEADER)
    r = results
    tags = [r["variant"]] if r.get("variant") else []
    if r.get("sft"):
        tags.append(f"SFT warm start on {r['sft']['tasks']} teacher tasks")
    if r.get("air") is False and not any("AIR off" in t for t in tags):
        tags.append("AIR off")
    label = f"{r['benchmark']} ({'; '.join(tags)})" if tags else r["benchmark"]
    after = score(r["after"])
    if r.get("warm"):
        after = f"**warm start:** {score(r['warm'])}; **warm start + GRPO:** {after}"
    row = (
        f"| {r['date']} | {label} | {r['model']} | {r['train_size']} / {r['test_size']} | "
        f"{r['steps']} x {r['batch_size']} x {r['group_size']} | {score(r['before'])} | "
        f"{after} | {r['wall_s'] / 60:.1f} min | {r['hardware']} | {r['seed']} | "
        f"`{r['command']}` |\n"
    )
    with path.open("a") as f:
        f.write(row)


def data_dir(arg: Path | None, name: str, download: Callable[[Path], None]) -> Path:
    """``--data-dir`` if given; else a cache under ``~/.cache/agentlightning-lite/<name>`` filled by
    ``download(path)`` on first use (which raises a clear error when offline)."""
    if arg is not None:
        if not Path(arg).exists():
            raise SystemExit(f"--data-dir {arg}: no such directory")
        return Path(arg)
    cache = Path(os.environ.get("AGL_DATA_CACHE", Path.home() / ".cache" / "agentlightning-lite")) / name
    marker = cache / ".complete"
    if not marker.exists():
        cache.mkdir(parents=True, exist_ok=True)
        download(cache)
        marker.write_text(dt.datetime.now().isoformat())
    return cache
