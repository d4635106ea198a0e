"""APO alone, GRPO alone, APO then GRPO, at the same number of rollouts (a skeleton: not run yet).

    python -m benchmarks.apo.bench_apo --agent examples/calc_agent.py:calc_agent --tasks demo \\
        --rollouts 256 --seeds 0 1 2 --held-out 64
    python -m benchmarks.apo.bench_apo ... --reflection-base-url https://api.openai.com/v1 \\
        --reflection-model gpt-4.1-mini        # a stronger reflection model (key: $OPENAI_API_KEY)

Each arm starts from the same policy (the embedded SmolLM2-135M on CPU by default, which is also the
reflection model unless one is given) and spends ``--rollouts`` rollouts on training tasks; the held-out
success rate is measured before and after. The agent must read its prompt with ``agl.prompt`` /
``llm.prompt`` for APO to change anything: ``examples/calc_agent.py`` and the Calc-X AutoGen agent do not
yet (their system prompts are module constants), which is what is left before this runs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.cli.train import load_agent

ARMS = ("apo", "grpo", "apo+grpo")


def tasks_for(name: str, n_train: int, n_val: int, seed: int) -> tuple[list[Any], list[Any]]:
    if name == "demo":
        from examples.calc_agent import make_tasks  # type: ignore[import-not-found]

        return make_tasks(n_train, seed=1000 + seed), make_tasks(n_val, seed=seed)
    if name == "calc_x":
        from benchmarks.calc_x.data import load_dataset

        return load_dataset("train")[:n_train], load_dataset("test")[:n_val]
    raise ValueError(f"--tasks is 'demo' or 'calc_x', got {name!r}")


def run_arm(
    arm: str, agent: Any, train: list[Any], val: list[Any], args: argparse.Namespace, seed: int
) -> dict:
    """One arm on one seed: ``args.rollouts`` training rollouts in all, then the held-out score."""
    reflection: Any = "policy"
    if args.reflection_base_url:
        reflection = agl.LLM(
            base_url=args.reflection_base_url, model=args.reflection_model, api_key=args.api_key
        )
    out = Path(args.output_dir) / f"{arm.replace('+', '-then-')}-seed{seed}"
    group, batch = args.group_size, args.batch_size
    apo_budget = args.rollouts if arm == "apo" else args.rollouts // 2 if arm == "apo+grpo" else 0
    grpo_steps = (args.rollouts - apo_budget) // (group * batch)
    t0 = time.time()
    with agl.Trainer(model=args.model, output_dir=out, seed=seed, batch_size=batch) as trainer:
        before = trainer.evaluate(agent, val)
        if apo_budget:
            trainer.fit(
                agent,
                train,
                val_dataset=train[: args.apo_val],
                algorithm=agl.APO(reflection, apo_budget, seed=seed),
            )
        if grpo_steps:
            trainer.fit(agent, train, steps=trainer.step + grpo_steps, algorithm=agl.GRPO(group_size=group))
        after = trainer.evaluate(agent, val)
        rollouts = len(trainer.store.rollouts(mode="train"))
    return {
        "arm": arm,
        "seed": seed,
        "before": before,
        "after": after,
        "train_rollouts": rollouts,
        "apo_budget": apo_budget,
        "grpo_steps": grpo_steps,
        "wall_s": round(time.time() - t0, 1),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agent", required=True, help="module:function or file.py:function reading agl.prompt")
    ap.add_argument("--tasks", choices=("demo", "calc_x"), default="demo")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    ap.add_argument("--rollouts", type=int, default=256, help="training rollouts per arm")
    ap.add_argument("--train-size", type=int, default=64)
    ap.add_argument("--held-out", type=int, default=64)
    ap.add_argument("--apo-val", type=int, default=16, help="training tasks APO scores candidates on")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--reflection-base-url", default=None)
    ap.add_argument("--reflection-model", default=None)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--output-dir", default="runs/bench_apo")
    args = ap.parse_args(argv)
    agent, _ = load_agent(args.agent)
    rows = []
    for seed in args.seeds:
        train, val = tasks_for(args.tasks, args.train_size, args.held_out, seed)
        for arm in args.arms:
            rows.append(run_arm(arm, agent, train, val, args, seed))
            print(json.dumps(rows[-1], default=str), flush=True)
    return rows


if __name__ == "__main__":
    main()
