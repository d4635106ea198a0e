"""A learning benchmark with room to move: reasoning-gym tasks on SmolLM2-135M, algorithms side by side.

    python -m benchmarks.learning_rg base-rates          # the untrained model on each candidate task
    python -m benchmarks.learning_rg grid --task arith3 --seeds 0 1 2 --resume   # every config x seed
    python -m benchmarks.learning_rg report --task arith3   # rewrite the results file from the runs

``base-rates`` measures the held-out score of the untrained embedded model (greedy, temperature 0) on
each candidate task preset (``--list`` shows them) and writes ``base_rates.md``. ``grid`` trains each
configuration on each seed, one after the other (seed by seed, every configuration of a seed before the
next seed), and writes one JSON file per finished run under
``benchmarks/learning_rg/results/<task>-<prompt>/``;
with ``--resume`` the runs that already have their file are skipped, so a later call completes the grid.
After each run the results file ``results_<task>-<prompt>.md`` (tables, mean +- std over seeds, per
seed) and the plot ``curves_<task>-<prompt>.png`` are rewritten from every run file found, saying which
cells are not measured.

Configurations (``--configs``): ``grpo-sync`` (GRPO, alternating rollouts and updates), ``ppo-sync``
(PPO, the same rollouts per step), ``grpo-async`` (GRPO, ``RolloutConfig(async_rollouts=True)``, rollouts
at most ``--max-staleness`` weights versions old), ``grpo-async-tis`` (the same with the importance
correction ``UpdateConfig(correction=agl.TIS(cap=2.0))``), ``ppo-async``.

The held-out tasks are the same for every seed and configuration (reasoning-gym seed ``--eval-seed``),
so the untrained score is measured once per task preset and reused (``before.json``); the seed sets the
training tasks (reasoning-gym seed ``1000 + seed``), their order, the sampling and the adapter's init.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

# name -> (reasoning-gym dataset, its config)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "arith2": (
        "basic_arithmetic",
        {
            "min_terms": 2,
            "max_terms": 2,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
    ),
    "arith3": (
        "basic_arithmetic",
        {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
    ),
    "arith3x": (
        "basic_arithmetic",
        {
            "min_terms": 2,
            "max_terms": 3,
            "min_digits": 1,
            "max_digits": 1,
            "operators": ["+", "-", "*"],
            "allow_parentheses": False,
            "allow_negation": False,
        },
    ),
    "legs2": ("leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}),
    "spell5": ("spell_backward", {"min_word_len": 3, "max_word_len": 5}),
    "chain2": ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
    "letters": ("letter_counting", {"min_words": 3, "max_words": 5}),
    "chain1": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
    "prod1": ("products", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}),
}

# system prompts: reasoning-gym's own (think step by step, then <answer>), or one asking for the answer alone
PROMPTS: dict[str, str | None] = {
    "default": None,
    "short": "Give only the final answer, in the form <answer>your answer</answer>, with no explanation.",
    "example": (
        "Reply with the final answer alone inside answer tags and nothing else, "
        "for example: <answer>42</answer>"
    ),
}

CONFIGS = ("grpo-sync", "ppo-sync", "grpo-async", "grpo-async-tis", "ppo-async")


# the agent's client waits up to 2 h for a reply: on a loaded CPU a request queued behind other batches
# outlasts the OpenAI client's default 600 s, and the rollout would fail instead of being measured
CLIENT_TIMEOUT_S = 7200.0

# requests decoded together and rollouts run at once: a held-out set is evaluated 64 at a time (a step's
# 16 training rollouts all run together either way; greedy and seeded replies do not depend on the batch)
EVAL_BATCH = 64


def make_env(
    preset: str, size: int, seed: int, max_tokens: int, prompt: str = "default", shots: int = 0
) -> Any:
    """The preset's reasoning-gym environment: ``size`` tasks generated from ``seed``, its agent's
    system prompt ``PROMPTS[prompt]``, ``shots`` solved examples before each question.

    >>> env = make_env("arith3", 2, 10_000, 48, "short")
    >>> env.system_prompt == PROMPTS["short"], env.max_tokens, env.tasks[0]["name"]
    (True, 48, 'basic_arithmetic')
    """

    import agentlightning_lite as agl

    name, config = PRESETS[preset]
    return agl.envs.ReasoningGym(
        name,
        size=size,
        seed=seed,
        max_tokens=max_tokens,
        system_prompt=PROMPTS[prompt],
        shots=shots,
        timeout=CLIENT_TIMEOUT_S,
        stop=(),  # the results here were measured without the default agent's stop string </answer>
        **config,
    )


def variant(args: argparse.Namespace) -> str:
    """How the agent is prompted, as it appears in file names: ``short`` or ``short-3shot``."""
    shots = getattr(args, "shots", 0)
    return f"{args.prompt}-{shots}shot" if shots else args.prompt


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


# ``--precision``: the engine's ``autocast`` (generation and the update): "auto" is the library's default
# (bfloat16 autocast on a CPU with bfloat16 units), "float32" turns autocast off (TRL's default on a CPU)
PRECISIONS = {"auto": "auto", "float32": None, "bfloat16": "bfloat16"}


def _quiet_trainer(output_dir: Path, seed: int = 0, precision: str = "auto", **kwargs: Any) -> Any:
    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig

    kwargs.setdefault("rollout_config", RolloutConfig(timeout=3600, concurrency=EVAL_BATCH))
    return agl.Trainer(
        model="smollm2-135m",
        engine_options={"max_batch_size": EVAL_BATCH, "autocast": PRECISIONS[precision]},
        output_dir=str(output_dir),
        seed=seed,
        logging_config=LoggingConfig(loggers=[]),
        **kwargs,
    )


# ----------------------------------------------------------------------------------------- base rates


def reply_stats(store: Any, mode: str = "val") -> dict[str, Any]:
    """Replies of the ``mode`` rollouts in ``store``: how many, mean response tokens, how many were cut
    at ``max_tokens`` (``finish_reason == "length"``), and one example reply.

    >>> import agentlightning_lite as agl
    >>> reply_stats(agl.MemoryStore())
    {'replies': 0, 'mean_tokens': 0.0, 'cut': 0, 'example': None}
    """
    return _replies_of(store, list(store.rollouts(mode=mode)))


def per_task(store: Any, mode: str = "val") -> dict[str, float | None]:
    """Each ``mode`` rollout's reward by its reasoning-gym task index (``None``: the rollout failed).

    >>> import agentlightning_lite as agl
    >>> store = agl.MemoryStore()
    >>> ro = store.start_rollout(task={"index": 3}, mode="val")
    >>> store.set_reward(ro.rollout_id, 1.0)
    >>> per_task(store)
    {'3': 1.0}
    """
    return {str(ro.task["index"]): ro.reward for ro in store.rollouts(mode=mode)}


def base_rates(args: argparse.Namespace) -> None:
    """The untrained model's held-out score on each preset: one JSON file per preset under
    ``results/base_rates/``, and ``base_rates.md`` rewritten from every such file after each preset."""
    import agentlightning_lite as agl

    _threads(args.threads)
    folder = Path(args.results_dir or HERE / "results") / "base_rates"
    folder.mkdir(parents=True, exist_ok=True)
    for preset in args.tasks:
        path = folder / f"{preset}-{variant(args)}.json"
        if args.resume and path.exists():
            continue
        env = make_env(preset, args.n, args.eval_seed, args.max_tokens, args.prompt, args.shots)
        store = agl.MemoryStore()
        trainer = _quiet_trainer(Path(args.work_dir) / "base-rates", store=store)
        t0 = time.time()
        res = trainer.evaluate(env.agent, env.tasks)
        wall = time.time() - t0
        stats = reply_stats(store)
        trainer.close()
        cmd = (
            f"nice -n 15 python -m benchmarks.learning_rg base-rates --tasks {preset} --n {args.n} "
            f"--max-tokens {args.max_tokens} --eval-seed {args.eval_seed} --prompt {args.prompt} "
            f"--shots {args.shots}" + (f" --threads {args.threads}" if args.threads else "")
        )
        out = {"preset": preset, "command": cmd, "max_tokens": args.max_tokens, "eval_seed": args.eval_seed}
        out["prompt"], out["shots"] = args.prompt, args.shots
        out |= {"result": res, "replies": stats, "wall_s": round(wall, 1), "load_avg": os.getloadavg()}
        out["per_task"] = per_task(store)
        out["first_error"] = next((ro.error for ro in store.rollouts(mode="val") if ro.error), None)
        path.write_text(json.dumps(out, indent=2))
        print(f"{preset}: {res['success_rate']:.1%} of {res['n']}, {stats}", flush=True)
        write_base_rates(folder, args.out or HERE / "base_rates.md")


def write_base_rates(folder: Path, out: Path) -> None:
    """``base_rates.md`` from the preset files in ``folder``."""
    rows, cmds = [], []
    for path in sorted(folder.glob("*.json")):
        r = json.loads(path.read_text())
        res, st = r["result"], r["replies"]
        k = round(res["success_rate"] * res["n"])
        lo, hi = wilson(k, res["n"])
        name, config = PRESETS[r["preset"]]
        rows.append(
            f"| `{r['preset']}` | `{name}` `{json.dumps(config)}` | {r.get('prompt', 'default')} "
            f"| {r.get('shots', 0)} | {k}/{res['n']} = {res['success_rate']:.1%} "
            f"| {lo:.1%}-{hi:.1%} | {st['mean_tokens']:.0f} | {st['cut']}/{st['replies']} | {res['failed']} "
            f"| {r['max_tokens']} | {r['wall_s'] / 60:.1f} min (load {r['load_avg'][0]:.1f}) |"
        )
        cmds.append(f"    {r['command']}")
    lines = [
        "# Base rates: the untrained SmolLM2-135M-Instruct on reasoning-gym tasks",
        "",
        "Commands (one per preset; `--resume` skips the presets already measured):",
        "",
        *cmds,
        "",
        _machine_line(),
        "Each task is `agl.envs.ReasoningGym(name, size=n, seed=eval_seed, max_tokens=..., **config)` "
        "with its default agent (reasoning-gym's default system prompt, one chat call, the answer in "
        "`<answer>...</answer>` or else the reply's last line), measured with `trainer.evaluate` at "
        "temperature 0 on the embedded model; the score is the dataset's own `score_answer`. "
        "The held-out seed is the grid's (10000), so these are the tasks the benchmark holds out. "
        "Prompt `default` is reasoning-gym's; "
        + "; ".join(f"`{k}` is {v!r}" for k, v in PROMPTS.items() if v is not None)
        + ".",
        "",
        "`shots`: solved examples of the same generator (seed 777) before the question, as earlier "
        "user/assistant turns answering `<answer>ANSWER</answer>` (`ReasoningGym(shots=)`).",
        "",
        "| preset | dataset and config | prompt | shots | held-out success | Wilson 95% | mean reply tokens "
        "| cut at max_tokens "
        "| failed | max_tokens | wall |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
    ]
    notes = out.with_name("base_rates_notes.md")
    if notes.exists():
        lines += [notes.read_text().strip(), ""]
    out.write_text("\n".join(lines))


# ----------------------------------------------------------------------------------------------- grid


def _algorithm(config: str, args: argparse.Namespace) -> Any:
    import agentlightning_lite as agl

    lr = {} if args.lr is None else {"lr": args.lr}  # None: the library's default
    if config.startswith("ppo"):
        return agl.PPO(group_size=args.group_size, epochs=1, micro_batch_size=16, **lr)
    return agl.GRPO(
        group_size=args.group_size,
        micro_batch_size=16,
        zero_spread=getattr(args, "zero_spread", "drop"),
        **lr,
    )


def _run_dir(args: argparse.Namespace) -> Path:
    return Path(args.results_dir or HERE / "results") / _grid_name(args)


def _grid_name(args: argparse.Namespace) -> str:
    """A grid's name: its task preset and prompt (``arith3-short``); its files are named after it."""
    return f"{args.task}-{variant(args)}"


def before_score(args: argparse.Namespace) -> dict[str, Any]:
    """The untrained model on the held-out tasks, measured once per preset and kept in ``before.json``.

    The held-out tasks are the first ``eval_size`` tasks of the base rates' (same reasoning-gym seed:
    reasoning-gym draws each task from the seed and its index), so when ``base-rates`` measured this
    preset with the same ``max_tokens`` on at least as many tasks, its first ``eval_size`` scores are
    taken instead of evaluating again (``"source"`` says which).
    """
    path = _run_dir(args) / "before.json"
    key = {
        "eval_size": args.eval_size,
        "eval_seed": args.eval_seed,
        "max_tokens": args.max_tokens,
        "prompt": args.prompt,
        "shots": args.shots,
    }
    if path.exists():
        saved = json.loads(path.read_text())
        if all(saved.get(k) == v for k, v in key.items()):
            return dict(saved)
    out = _before_from_base_rates(args)
    if out is None:
        import agentlightning_lite as agl

        held_out = make_env(
            args.task, args.eval_size, args.eval_seed, args.max_tokens, args.prompt, args.shots
        )
        store = agl.MemoryStore()
        trainer = _quiet_trainer(
            Path(args.work_dir) / _grid_name(args) / "before",
            store=store,
            precision=getattr(args, "precision", "auto"),
        )
        t0 = time.time()
        res = trainer.evaluate(held_out.agent, held_out.tasks)
        trainer.close()
        out = {**key, "before": res, "source": "evaluated", "wall_s": round(time.time() - t0, 1)}
        out["per_task"] = per_task(store)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2))
    return out


def _before_from_base_rates(args: argparse.Namespace) -> dict[str, Any] | None:
    """The untrained score of the first ``eval_size`` base-rate tasks, when ``base-rates`` measured
    this preset with the same settings on at least as many tasks; else ``None``."""
    base = Path(args.results_dir or HERE / "results") / "base_rates" / f"{args.task}-{variant(args)}.json"
    rates = json.loads(base.read_text()) if base.exists() else {}
    scores = rates.get("per_task", {})
    if not (
        rates.get("eval_seed") == args.eval_seed
        and rates.get("max_tokens") == args.max_tokens
        and rates.get("prompt", "default") == args.prompt
        and rates.get("shots", 0) == args.shots
        and all(str(i) in scores for i in range(args.eval_size))
    ):
        return None
    xs = [scores[str(i)] for i in range(args.eval_size)]
    ok = [x for x in xs if x is not None]
    res = {
        "mean_reward": statistics.fmean(ok) if ok else 0.0,
        "success_rate": sum(x >= 1.0 for x in ok) / len(xs),
        "n": len(xs),
        "failed": len(xs) - len(ok),
    }
    key = {k: getattr(args, k) for k in ("eval_size", "eval_seed", "max_tokens", "prompt", "shots")}
    return {**key, "before": res, "source": str(base.relative_to(base.parents[2])), "wall_s": 0.0}


def train_one(args: argparse.Namespace, config: str, seed: int) -> dict[str, Any]:
    """Train ``config`` on ``seed`` and measure the held-out score after; the run's JSON record."""
    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import RolloutConfig, SampleConfig, UpdateConfig

    asynchronous = "async" in config
    out_dir = Path(args.work_dir) / _grid_name(args) / f"{config}-seed{seed}"
    if out_dir.exists():
        import shutil

        shutil.rmtree(out_dir)
    train = make_env(
        args.task, args.steps * args.batch_size, 1000 + seed, args.max_tokens, args.prompt, args.shots
    )
    held_out = make_env(args.task, args.eval_size, args.eval_seed, args.max_tokens, args.prompt, args.shots)
    trainer = _quiet_trainer(
        out_dir,
        seed=seed,
        precision=getattr(args, "precision", "auto"),
        algorithm=(algorithm := _algorithm(config, args)),
        lora=agl.LoRA(r=16, alpha=32),
        batch_size=args.batch_size,
        rollout_config=RolloutConfig(timeout=3600, async_rollouts=asynchronous, concurrency=EVAL_BATCH),
        sample_config=SampleConfig(max_staleness=args.max_staleness if asynchronous else None),
        update_config=UpdateConfig(correction=agl.TIS(cap=2.0) if config.endswith("-tis") else None),
    )
    t0, train_s, seen = time.time(), 0.0, set()
    curve = []
    every = args.eval_every or args.steps
    if args.eval_every:  # the untrained point: the model before any update (same for every seed)
        b = before_score(args)
        seen = {ro.rollout_id for ro in trainer.store.rollouts(mode="val")}
        curve.append(_point(0, 0, 0.0, b["before"], {"cut": None}, None))
    while trainer.step < args.steps:
        t1 = time.time()
        trainer.fit(train.agent, train.tasks, steps=min(trainer.step + every, args.steps))
        train_s += time.time() - t1
        if trainer.step < args.steps or args.eval_every:
            res = trainer.evaluate(held_out.agent, held_out.tasks)
            new = [ro for ro in trainer.store.rollouts(mode="val") if ro.rollout_id not in seen]
            seen |= {ro.rollout_id for ro in new}
            rollouts = trainer.step * args.batch_size * args.group_size
            curve.append(_point(trainer.step, rollouts, train_s, res, _replies_of(trainer.store, new), None))
            print(
                f"  {config} seed {seed} step {trainer.step}: held-out {res['success_rate']:.1%}", flush=True
            )
    t_train = train_s
    after = trainer.evaluate(held_out.agent, held_out.tasks) if not curve else res
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [m.get("train/reward_mean") for m in metrics if "train/reward_mean" in m]
    for point in curve[1:]:  # the mean training reward of the steps up to each point
        point["train_reward"] = rewards[point["step"] - 1] if point["step"] <= len(rewards) else None
    latest = [ro for ro in trainer.store.rollouts(mode="val")][-args.eval_size :]
    after_tasks = {str(ro.task["index"]): ro.reward for ro in latest}
    after_replies = _replies_of(trainer.store, latest)
    trainer.close()
    keys = (
        "train/reward_mean",
        "train/success_rate",
        "async/staleness_mean",
        "async/dropped_stale",
        "mismatch/kl_k3",
        "mismatch/clipped_frac",
        "samples/truncated",
        "grpo/zero_std_groups",
        "time/rollouts_s",
        "time/update_s",
    )
    return {
        "task": args.task,
        "config": config,
        "seed": seed,
        "steps": args.steps,
        "batch_size": args.batch_size,
        "group_size": args.group_size,
        "lr": algorithm.lr,
        "max_tokens": args.max_tokens,
        "prompt": args.prompt,
        "shots": args.shots,
        "max_staleness": args.max_staleness if asynchronous else None,
        "precision": args.precision,
        "zero_spread": args.zero_spread if not config.startswith("ppo") else None,
        "eval_size": args.eval_size,
        "eval_seed": args.eval_seed,
        "after": after,
        "after_per_task": after_tasks,
        "after_replies": after_replies,
        "curves": {k: [m.get(k) for m in metrics if "train/reward_mean" in m] for k in keys},
        "train_wall_s": round(t_train, 1),
        "eval_every": args.eval_every,
        "heldout_curve": curve,
        "wall_s": round(time.time() - t0, 1),
        "load_avg": os.getloadavg(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def _point(
    step: int, rollouts: int, train_s: float, res: dict[str, Any], cut: dict[str, Any], reward: float | None
) -> dict[str, Any]:
    """One point of a run's held-out curve."""
    return {
        "step": step,
        "rollouts": rollouts,
        "train_wall_s": round(train_s, 1),
        "heldout_success": res["success_rate"],
        "heldout_reward": res["mean_reward"],
        "heldout_cut": cut["cut"],
        "train_reward": reward,
    }


def _replies_of(store: Any, rollouts: list[Any]) -> dict[str, Any]:
    """:func:`reply_stats` of the given rollouts only (one evaluation among several in a store)."""
    lengths, cut, example = [], 0, None
    for ro in rollouts:
        for span in store.spans(ro.rollout_id):
            if span.kind != "llm":
                continue
            lengths.append(len(span.response_token_ids or []))
            reason = span.attributes.get("engine_finish_reason") or span.attributes.get("finish_reason")
            cut += reason == "length"
            if example is None:
                out = span.output
                example = out.get("content") if isinstance(out, dict) else out
                example = example if isinstance(example, str) else json.dumps(out)[:600]
    mean = statistics.fmean(lengths) if lengths else 0.0
    return {"replies": len(lengths), "mean_tokens": round(mean, 1), "cut": cut, "example": example}


def grid(args: argparse.Namespace) -> None:
    """Every configuration on every seed; one JSON file per finished run, the report after each."""
    _threads(args.threads)
    run_dir = _run_dir(args)
    run_dir.mkdir(parents=True, exist_ok=True)
    if not (run_dir / "command.txt").exists():  # grids split over processes by --configs keep the first
        (run_dir / "command.txt").write_text(_grid_command(args) + "\n")
    for seed in args.seeds:
        for config in args.configs:
            path = run_dir / f"{config}-seed{seed}.json"
            if args.resume and path.exists():
                print(f"{path.name}: done, skipped", flush=True)
                continue
            res = train_one(args, config, seed)
            path.write_text(json.dumps(res, indent=2))
            print(
                f"{config} seed {seed}: after {res['after']['success_rate']:.1%} "
                f"({res['wall_s'] / 60:.1f} min)",
                flush=True,
            )
            report(args)
    before = before_score(args)  # after the runs: the base rates may have measured it meanwhile
    print(f"before training: {before['before']['success_rate']:.1%} of {before['before']['n']}", flush=True)
    report(args)


def _grid_command(args: argparse.Namespace) -> str:
    return (
        f"nice -n 15 python -m benchmarks.learning_rg grid --task {args.task} "
        f"--configs {' '.join(args.configs)} --seeds {' '.join(map(str, args.seeds))} --steps {args.steps} "
        f"--batch-size {args.batch_size} --group-size {args.group_size} "
        + (f"--lr {args.lr} " if args.lr is not None else "")
        + (f"--eval-every {args.eval_every} " if getattr(args, "eval_every", 0) else "")
        + f"--max-tokens {args.max_tokens} --eval-size {args.eval_size} --eval-seed {args.eval_seed} "
        f"--max-staleness {args.max_staleness} --prompt {args.prompt} --shots {args.shots}"
        + (f" --threads {args.threads}" if args.threads else "")
        + (f" --precision {args.precision}" if getattr(args, "precision", "auto") != "auto" else "")
        + (f" --zero-spread {args.zero_spread}" if getattr(args, "zero_spread", "drop") != "drop" else "")
        + " --resume"
    )


# --------------------------------------------------------------------------------------------- report

T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``k / n``.

    >>> [round(x, 3) for x in wilson(5, 10)]
    [0.237, 0.763]
    """
    if n == 0:
        return float("nan"), float("nan")
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return c - h, c + h


def _mean_std(xs: list[float]) -> str:
    if not xs:
        return "not measured"
    if len(xs) == 1:
        return f"{xs[0]:.1%} (1 seed)"
    return f"{statistics.fmean(xs):.1%} ± {statistics.stdev(xs):.1%}"


def _machine_line() -> str:
    return (
        f"Date: {dt.date.today()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), "
        "no GPU; "
        f"Python {platform.python_version()}; load average now "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}.  "
    )


def report(args: argparse.Namespace) -> Path:
    """Rewrite ``results_<task>-<prompt>.md`` and ``curves_<task>-<prompt>.png`` from the run files."""
    run_dir = _run_dir(args)
    before_path = run_dir / "before.json"
    before = json.loads(before_path.read_text()) if before_path.exists() else _before_from_base_rates(args)
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    for path in sorted(run_dir.glob("*-seed*.json")):
        r = json.loads(path.read_text())
        runs[r["config"], r["seed"]] = r
    seeds = sorted({s for _, s in runs} | set(args.seeds))
    configs = [c for c in CONFIGS if c in args.configs or any(k[0] == c for k in runs)]
    configs += sorted({c for c, _ in runs} - set(configs))  # e.g. "trl-grpo" (trl_side.py)
    cmd_path = run_dir / "command.txt"
    cmd = cmd_path.read_text().strip() if cmd_path.exists() else _grid_command(args)
    name, config = PRESETS[args.task]
    n = before["before"]["n"] if before else args.eval_size
    b = before["before"]["success_rate"] if before else float("nan")
    any_run = next(iter(runs.values()), None)
    lines = [
        f"# Learning on reasoning-gym `{name}`: SmolLM2-135M-Instruct, algorithms side by side",
        "",
        f"Command: `{cmd}`  ",
        _machine_line(),
        f"Task preset `{args.task}`: `{name}` {json.dumps(config)}, the default agent of "
        "`agl.envs.ReasoningGym` "
        "(one chat call, the answer in `<answer>` tags or the reply's last line, scored by the dataset's "
        "`score_answer`; the system prompt below).  ",
    ]
    if any_run:
        lines.append(
            f"Each run: {any_run['steps']} updates of {any_run['batch_size']} tasks x "
            f"{any_run['group_size']} "
            f"rollouts (temperature 1, max_tokens {any_run['max_tokens']}), LoRA r=16 on the embedded model, "
            f"lr {any_run['lr']}; PPO takes the same rollouts per step (its own value head, GAE, 1 epoch). "
            "Async: `RolloutConfig(async_rollouts=True)`, "
            f"`SampleConfig(max_staleness={args.max_staleness})`; "
            "`-tis`: `UpdateConfig(correction=agl.TIS(cap=2.0))`. Training tasks are generated from seed "
            "1000 + seed. System prompt: "
            + (
                "reasoning-gym's default."
                if any_run.get("prompt", "default") == "default"
                else f"{PROMPTS[any_run['prompt']]!r} (`--prompt {any_run['prompt']}`)."
            )
            + (
                f" {any_run['shots']} solved examples (reasoning-gym seed 777) as earlier turns before "
                f"each question (`--shots {any_run['shots']}`)."
                if any_run.get("shots")
                else ""
            )
            + "  "
        )
    lines += [
        f"Held-out: the same {n} tasks (seed {args.eval_seed}) for every run, greedy. Untrained: "
        + (f"**{b:.1%}** ({round(b * n)}/{n})." if before else "not measured yet."),
        "",
        "## Held-out success after training",
        "",
        "| config | "
        + " | ".join(f"seed {s}" for s in seeds)
        + " | mean ± std over seeds | change vs untrained "
        "| pooled, Wilson 95% |",
        "|---|" + "---:|" * (len(seeds) + 3),
    ]
    mixed = len({r["steps"] for r in runs.values()}) > 1  # runs of different lengths: each cell says its own
    for c in configs:
        xs = [runs[c, s]["after"]["success_rate"] for s in seeds if (c, s) in runs]
        cells = [
            f"{runs[c, s]['after']['success_rate']:.1%}" + (f" ({runs[c, s]['steps']} upd.)" if mixed else "")
            if (c, s) in runs
            else "not measured"
            for s in seeds
        ]
        if xs:
            k = sum(round(x * n) for x in xs)
            lo, hi = wilson(k, n * len(xs))
            gain = f"{statistics.fmean(xs) - b:+.1%}"
            pooled = f"{k}/{n * len(xs)} ({lo:.1%}-{hi:.1%})"
        else:
            gain = pooled = "-"
        lines.append(f"| `{c}` | " + " | ".join(cells) + f" | {_mean_std(xs)} | {gain} | {pooled} |")
    lines += [
        "",
        "## Per run",
        "",
        "| config | seed | after | train reward per step | staleness mean | dropped stale "
        "| truncated replies "
        "per step | held-out replies after: mean tokens, cut | wall (train + eval) | load avg at end |",
        "|---|---:|---:|---|---:|---:|---|---:|---:|---:|",
    ]
    for c in configs:
        for s in seeds:
            r = runs.get((c, s))
            if r is None:
                lines.append(f"| `{c}` | {s} | not measured |" + " |" * 7)
                continue
            cv = r.get("curves") or {"train/reward_mean": _train_rewards(r)}
            stale = [x for x in cv.get("async/staleness_mean", []) if x is not None]
            dropped = [x for x in cv.get("async/dropped_stale", []) if x is not None]
            trunc = cv.get("samples/truncated", [])
            cells = [
                f"`{c}`",
                str(s),
                f"{r['after']['success_rate']:.1%}",
                " ".join(f"{x:.2f}" for x in cv["train/reward_mean"]),
                f"{statistics.fmean(stale):.2f}" if stale else "-",
                f"{sum(dropped):.0f}" if dropped else "-",
                " ".join("-" if x is None else f"{x:.0f}" for x in trunc) or "-",
                _replies(r.get("after_replies")),
                f"{r['wall_s'] / 60:.1f} min",
                f"{r['load_avg'][0]:.1f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "![training reward per step](" + f"curves_{_grid_name(args)}.png)", ""]
    lines += [x.replace("PLACEHOLDER", _grid_name(args)) for x in _curve_table(runs, configs, seeds)]
    lines += _noise_note(runs, configs, seeds, n)
    out_dir = Path(args.out_dir or HERE)
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = out_dir / f"notes_{_grid_name(args)}.md"
    if notes.exists():
        lines += ["", notes.read_text().strip(), ""]
    out = out_dir / f"results_{_grid_name(args)}.md"
    out.write_text("\n".join(lines) + "\n")
    _plot(runs, configs, seeds, out_dir / f"curves_{_grid_name(args)}.png", b)
    _plot_heldout(runs, configs, seeds, out_dir / f"heldout_{_grid_name(args)}.png", b)
    return out


def _curve(run: dict[str, Any]) -> list[dict[str, Any]]:
    """A run's held-out curve: ours (``heldout_curve``) or trl_side.py's (``curve``); [] if none."""
    return list(run.get("heldout_curve") or run.get("curve") or [])


def _curve_table(
    runs: dict[tuple[str, int], dict[str, Any]], configs: list[str], seeds: list[int]
) -> list[str]:
    """Held-out success at each evaluated update, with the training wall time spent to reach it."""
    rows = [(c, s) for c in configs for s in seeds if len(_curve(runs.get((c, s), {}))) > 1]
    if not rows:
        return []
    out = [
        "## Held-out success along training",
        "",
        "Each cell: held-out success after that many rollouts, and the training wall time (rollouts and "
        "updates; the evaluations excluded) spent to reach it.",
        "",
    ]
    points = sorted({p["rollouts"] for c, s in rows for p in _curve(runs[c, s])})
    out += ["| config | seed | " + " | ".join(f"{x} rollouts" for x in points) + " |"]
    out += ["|---|---:|" + "---:|" * len(points)]
    for c, s in rows:
        by = {p["rollouts"]: p for p in _curve(runs[c, s])}
        cells = [
            f"{by[x]['heldout_success']:.1%} ({by[x]['train_wall_s'] / 60:.1f} min)" if x in by else "-"
            for x in points
        ]
        out.append(f"| `{c}` | {s} | " + " | ".join(cells) + " |")
    return [*out, "", "![held-out success against rollouts and wall time](heldout_PLACEHOLDER.png)", ""]


def _plot_heldout(
    runs: dict[tuple[str, int], dict[str, Any]],
    configs: list[str],
    seeds: list[int],
    path: Path,
    before: float,
) -> None:
    """Held-out success against rollouts (left) and training wall time (right), one line per run."""
    rows = [(c, s) for c in configs for s in seeds if len(_curve(runs.get((c, s), {}))) > 1]
    if not rows:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    colors: dict[str, Any] = {}
    for c, s in rows:
        pts = _curve(runs[c, s])
        for ax, key, scale in ((axes[0], "rollouts", 1.0), (axes[1], "train_wall_s", 60.0)):
            (line,) = ax.plot(
                [p[key] / scale for p in pts], [p["heldout_success"] for p in pts], "o-", alpha=0.75,
                color=colors.get(c), label=f"{c}" if c not in colors else None,
            )  # fmt: skip
        colors.setdefault(c, line.get_color())
    for ax, label in ((axes[0], "rollouts"), (axes[1], "training wall time (min)")):
        if not math.isnan(before):
            ax.axhline(before, color="grey", ls="--", lw=1)
        ax.set_xlabel(label)
        ax.set_ylim(-0.02, 1.02)
    axes[0].set_ylabel("held-out success (greedy)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _replies(stats: dict[str, Any] | None) -> str:
    if not stats or not stats.get("replies"):
        return "-"
    return f"{stats['mean_tokens']:.0f}, {stats['cut']}/{stats['replies']}"


def _noise_note(
    runs: dict[tuple[str, int], dict[str, Any]], configs: list[str], seeds: list[int], n: int
) -> list[str]:
    """Differences against ``grpo-sync`` on the seeds both have, with a t-interval over those seeds."""
    out = ["## Differences against `grpo-sync` (paired by seed)", ""]
    base = "grpo-sync"
    rows = []
    for c in configs:
        if c == base:
            continue
        both = [s for s in seeds if (c, s) in runs and (base, s) in runs]
        if not both:
            rows.append(f"- `{c}`: no seed measured for both: no comparison.")
            continue
        at = [_paired_point(runs[c, s], runs[base, s]) for s in both]
        d = [a - b for a, b, _ in at]
        m = statistics.fmean(d)
        where = sorted({r for _, _, r in at})
        both_txt = f"{both} after {', '.join(str(r) for r in where)} rollouts"
        if len(d) > 1:
            half = T95[len(d) - 1] * statistics.stdev(d) / math.sqrt(len(d))
            inside = m - half <= 0 <= m + half
            rows.append(
                f"- `{c}` - `{base}` over seeds {both_txt}: {m:+.1%} (95% t-interval {m - half:+.1%} to "
                f"{m + half:+.1%}): "
                + ("inside the noise (the interval holds 0)." if inside else "outside the noise.")
            )
            w = welch([a for a, _, _ in at], [b for _, b, _ in at])
            if w is not None:
                wm, lo, hi = w
                rows.append(
                    "  Unpaired (Welch; "
                    + (
                        "TRL and ours share only each seed's task order"
                        if c.startswith("trl")
                        else "seeds as independent"
                    )
                    + f"): {wm:+.1%} (95% {lo:+.1%} to {hi:+.1%}): "
                    + ("inside the noise." if lo <= 0 <= hi else "outside the noise.")
                )
        else:
            se = math.sqrt(2 * 0.25 / n)  # the widest binomial standard error of a difference of two scores
            rows.append(
                f"- `{c}` - `{base}` on seed {both[0]} only, after {where[0]} rollouts: {m:+.1%}; "
                "one seed gives no spread over seeds, "
                f"and one held-out score of {n} tasks alone has a standard error up to "
                f"{math.sqrt(0.25 / n):.1%} "
                f"(a difference of two: up to {se:.1%})."
            )
    return out + rows


def welch(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """``mean(a) - mean(b)`` and its 95% Welch interval (unequal variances; the degrees of freedom of
    Welch-Satterthwaite rounded down, so the interval is never too narrow); ``None`` under two values a side.

    >>> d, lo, hi = welch([0.434, 0.352, 0.367], [0.504, 0.457, 0.449])
    >>> round(d, 3), lo < 0 < hi
    (-0.086, True)
    """
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    d = statistics.fmean(a) - statistics.fmean(b)
    if va + vb == 0:
        return d, d, d
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    t = T95[max(1, min(int(df), max(T95)))] if df < max(T95) + 1 else 1.96
    half = t * math.sqrt(va + vb)
    return d, d - half, d + half


def _train_rewards(run: dict[str, Any]) -> list[float]:
    """A run's train reward per step: ours (``curves``) or, for trl_side.py's, the points of its curve."""
    if run.get("curves"):
        return list(run["curves"]["train/reward_mean"])
    return [p["train_reward"] for p in _curve(run)[1:] if p.get("train_reward") is not None]


def _paired_point(run: dict[str, Any], base: dict[str, Any]) -> tuple[float, float, int]:
    """Two runs' held-out success at the most rollouts both were evaluated at, and that count.

    Runs of different lengths (a 16-update run beside a 32-update one evaluated every 16) are compared
    where both stood after the same rollouts, not each at its own end.
    """
    a = {p["rollouts"]: p["heldout_success"] for p in _curve(run)}
    b = {p["rollouts"]: p["heldout_success"] for p in _curve(base)}
    common = sorted(set(a) & set(b) - {0})
    if common:
        r = common[-1]
        return a[r], b[r], r
    rollouts = run["steps"] * run["batch_size"] * run["group_size"]
    return run["after"]["success_rate"], base["after"]["success_rate"], rollouts


def _plot(
    runs: dict[tuple[str, int], dict[str, Any]],
    configs: list[str],
    seeds: list[int],
    path: Path,
    before: float,
) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    styles = dict(zip(CONFIGS, ("o-", "s-", "^--", "v--", "d:"), strict=True)) | {"trl-grpo": "x-."}
    for c in configs:
        color = None
        for s in seeds:
            r = runs.get((c, s))
            if r is None:
                continue
            y = _train_rewards(r)
            (line,) = axes[0].plot(
                range(1, len(y) + 1), y, styles[c], color=color, alpha=0.7, label=c if color is None else None
            )
            color = line.get_color()
        xs = [runs[c, s]["after"]["success_rate"] for s in seeds if (c, s) in runs]
        if xs:
            i = configs.index(c)
            axes[1].scatter([i] * len(xs), xs, color=color, zorder=3)
            axes[1].errorbar(
                [i + 0.15],
                [statistics.fmean(xs)],
                yerr=[statistics.stdev(xs) if len(xs) > 1 else 0],
                fmt="k_",
            )
    axes[0].set_xlabel("update")
    axes[0].set_ylabel("train reward (step mean)")
    axes[0].xaxis.get_major_locator().set_params(integer=True)
    axes[0].set_ylim(-0.02, 1.02)
    if axes[0].get_legend_handles_labels()[1]:
        axes[0].legend(fontsize=8)
    if not math.isnan(before):
        axes[1].axhline(before, color="grey", ls="--", label="untrained")
        axes[1].legend(fontsize=8)
    axes[1].set_xticks(range(len(configs)), configs, rotation=20, fontsize=8)
    axes[1].set_ylabel("held-out success after")
    axes[1].set_title("dots: seeds; bar: mean ± std", fontsize=9)
    axes[1].set_ylim(-0.02, 1.02)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def sweep_report(args: argparse.Namespace) -> Path:
    """``lr_sweep.md`` and ``lr_sweep.png`` from the runs under ``<results>/sweep/lr<LR>/``: held-out
    success after training at each learning rate, against the untrained score."""
    root = Path(args.results_dir or HERE / "results") / "sweep"
    runs, found = [], []
    for path in sorted(root.glob(f"lr*/{args.task}-{variant(args)}/*-seed*.json")):
        runs.append(json.loads(path.read_text()))
        found.append(path.parents[1].name)
    runs.sort(key=lambda r: (r["lr"], r["seed"]))
    base = _before_from_base_rates(
        argparse.Namespace(**{**vars(args), "results_dir": str(root.parent / "recipe")})
    )
    b = base["before"]["success_rate"] if base else float("nan")
    n = args.eval_size
    lines = [
        f"# Learning-rate sweep: GRPO on `{args.task}` ({PRESETS[args.task][0]}), "
        "SmolLM2-135M-Instruct, LoRA r=16",
        "",
        "Command (one per learning rate, results under `results/sweep/lr<LR>/`):",
        "",
        "    nice -n 5 python -m benchmarks.learning_rg grid --task arith2 --configs grpo-sync --seeds 0 "
        "--steps 16 --batch-size 2 --group-size 8 --lr LR --max-tokens 16 --eval-size 256 --prompt short "
        "--shots 3 --threads 1 --results-dir benchmarks/learning_rg/results/sweep/lrLR --resume",
        "    python -m benchmarks.learning_rg sweep-report --task arith2 --prompt short --shots 3 "
        "--max-tokens 16 --eval-size 256",
        "",
        _machine_line(),
        f"Each run: {runs[0]['steps'] if runs else '?'} updates of 2 tasks x 8 rollouts (temperature 1, "
        "max_tokens 16), LoRA r=16 alpha=32, GRPO with the library's recipe (token-mean loss, group-std "
        "advantages, zero-spread groups dropped, no KL, one optimiser step per batch), seed 0. Held-out: "
        f"the same {n} tasks (reasoning-gym seed 10000), greedy. Untrained: **{b:.1%}**.  ",
        f"Runs found: {', '.join(found) or 'none'}.",
        "",
        "| lr | seed | held-out after | change | Wilson 95% | held-out replies cut "
        "| train reward, last 4 steps | training wall |",
        "|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for r in runs:
        x = r["after"]["success_rate"]
        lo, hi = wilson(round(x * n), n)
        rew = r["curves"]["train/reward_mean"][-4:]
        lines.append(
            f"| {r['lr']:g} | {r['seed']} | {x:.1%} | {x - b:+.1%} | {lo:.1%}-{hi:.1%} | "
            f"{r['after_replies']['cut']}/{r['after_replies']['replies']} | "
            + " ".join(f"{v:.2f}" for v in rew)
            + f" | {r['train_wall_s'] / 60:.1f} min |"
        )
    notes = HERE / "lr_sweep_notes.md"
    if notes.exists():
        lines += ["", notes.read_text().strip()]
    out = HERE / "lr_sweep.md"
    out.write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return out
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.plot(
        [r["lr"] for r in runs], [r["after"]["success_rate"] for r in runs], "o-", label="after 16 updates"
    )
    if not math.isnan(b):
        ax.axhline(b, color="grey", ls="--", label="untrained")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel(f"held-out success ({n} tasks)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "lr_sweep.png", dpi=90)
    plt.close(fig)
    return out


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--max-tokens", type=int, default=48, help="per reply, training and held-out")
    common.add_argument(
        "--eval-seed", type=int, default=10_000, help="reasoning-gym seed of the held-out tasks"
    )
    common.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    common.add_argument(
        "--prompt", choices=sorted(PROMPTS), default="short", help="the agent's system prompt"
    )
    common.add_argument(
        "--shots", type=int, default=0, help="solved examples before each question (agl.envs.ReasoningGym)"
    )
    common.add_argument("--work-dir", default="runs/learning_rg", help="stores, metrics, adapters")

    b = sub.add_parser("base-rates", parents=[common], help="the untrained model's held-out score per preset")
    b.add_argument("--tasks", nargs="+", choices=sorted(PRESETS), default=list(PRESETS))
    b.add_argument("--n", type=int, default=64, help="held-out tasks per preset")
    b.add_argument("--out", type=Path, default=None)
    b.add_argument("--resume", action="store_true", help="skip the presets already measured")
    b.add_argument(
        "--results-dir", default=None, help="where preset JSON files go (default: beside this file)"
    )

    sw = sub.add_parser("sweep-report", parents=[common], help="the learning-rate sweep's table and plot")
    sw.add_argument("--task", choices=sorted(PRESETS), required=True)
    sw.add_argument("--eval-size", type=int, default=256)
    sw.add_argument("--results-dir", default=None)

    for cmd in ("grid", "report"):
        g = sub.add_parser(
            cmd, parents=[common], help="train the grid" if cmd == "grid" else "rewrite the results"
        )
        g.add_argument("--task", choices=sorted(PRESETS), required=True)
        g.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS[:4]))
        g.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
        g.add_argument("--steps", type=int, default=3)
        g.add_argument("--batch-size", type=int, default=2, help="tasks per step")
        g.add_argument("--group-size", type=int, default=8, help="rollouts per task")
        g.add_argument("--lr", type=float, default=None, help="default: agl.GRPO's / agl.PPO's")
        g.add_argument("--eval-size", type=int, default=48)
        g.add_argument("--max-staleness", type=int, default=1)
        g.add_argument(
            "--precision",
            choices=sorted(PRECISIONS),
            default="auto",
            help="generation and update: the library's default (auto: bfloat16 autocast on a CPU with "
            "bfloat16 units), float32 (TRL's default on a CPU) or bfloat16 autocast",
        )
        g.add_argument(
            "--zero-spread", choices=("drop", "keep"), default="drop", help="agl.GRPO(zero_spread=...)"
        )
        g.add_argument(
            "--eval-every",
            type=int,
            default=0,
            help="held-out evaluation every N updates (0: only after the last); curves in the run files",
        )
        g.add_argument("--resume", action="store_true", help="skip the runs whose JSON file exists")
        g.add_argument(
            "--results-dir", default=None, help="where run JSON files go (default: beside this file)"
        )
        g.add_argument("--out-dir", default=None, help="results and plot (default: beside this file)")
    args = ap.parse_args(argv)
    if args.cmd == "base-rates":
        base_rates(args)
    elif args.cmd == "grid":
        grid(args)
    elif args.cmd == "sweep-report":
        print(sweep_report(args).read_text())
    else:
        print(report(args).read_text())


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"total {time.time() - t0:.0f} s")
