"""``agl-lite apo``: optimise the prompts an agent reads (``agl.prompt``) with ``agl.APO`` (GEPA)."""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

from ._common import (
    EXIT_CODES_HELP,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    Out,
    air_rules,
    fmt_num,
    json_default,
    print_error,
)
from .train import load_agent, load_tasks, prepare_tasks


def add_parser(sub: Any) -> None:
    apo = sub.add_parser(
        "apo",
        help="optimise an agent's prompts (agl.prompt) with GEPA, a reflection model and real rollouts",
        description=(
            "Run agl.Trainer(algorithm=agl.APO(...)).fit(agent, tasks, val_dataset=...). AGENT is "
            "'module:function', 'path/to/file.py:function' or a benchmark name, as for `agl-lite train`; it "
            "reads its prompts with agl.prompt(name, default=...) or llm.prompt(name, default=...). The "
            "policy model answers the agent's calls (served here, as for training); the reflection model "
            "(any OpenAI-compatible endpoint, or the policy itself) reads the traces and proposes new "
            "prompts. "
            "The best prompts are written to OUTPUT_DIR/prompts.json; `agl-lite train --prompts` trains "
            "from them."
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    apo.add_argument("agent", metavar="AGENT", help="module:function, file.py:function, or a benchmark name")
    apo.add_argument("--data", default=None, help="tasks the reflection learns from: .jsonl or .json list")
    apo.add_argument("--val-data", default=None, help="tasks candidates are scored on (default: --data)")
    apo.add_argument("--data-dir", default=None, help="benchmarks: where their data files are")
    apo.add_argument("--limit", type=int, default=None, help="use only the first N training tasks")
    apo.add_argument("--val-limit", type=int, default=None, help="use only the first N validation tasks")
    apo.add_argument("--budget", type=int, default=100, help="rollouts to spend (default 100)")
    apo.add_argument(
        "--components",
        nargs="+",
        metavar="KEY",
        help="only these: 'agent/name' or 'name' (default: all)",
    )
    apo.add_argument(
        "--reflection-base-url",
        default=None,
        help="OpenAI-compatible endpoint of the reflection model (default: the policy's own server)",
    )
    apo.add_argument("--reflection-model", default=None, help="model name at that endpoint")
    apo.add_argument(
        "--reflection-api-key",
        default=os.environ.get("AGL_REFLECTION_API_KEY") or os.environ.get("OPENAI_API_KEY"),
        help="its API key (default: $AGL_REFLECTION_API_KEY, else $OPENAI_API_KEY)",
    )
    apo.add_argument("--minibatch-size", type=int, default=3, help="tasks per reflection (default 3)")
    apo.add_argument(
        "--selection",
        choices=("pareto", "current_best", "epsilon_greedy", "top_k_pareto"),
        default="pareto",
        help="which candidate to improve next (default: pareto)",
    )
    apo.add_argument("--prompts", default=None, help="start from these prompts (a prompts.json)")
    apo.add_argument("--model", default="smollm2-135m", help="policy model (default: smollm2-135m)")
    apo.add_argument("--engine", choices=("auto", "hf", "vllm"), default="auto", help="default: auto")
    apo.add_argument("--tool-success", type=float, default=None, help="AIR: shown to the reflection model")
    apo.add_argument("--tool-error", type=float, default=None, help="AIR: shown to the reflection model")
    apo.add_argument("--concurrency", type=int, default=8, help="rollouts at once (default 8)")
    apo.add_argument("--rollout-timeout", type=float, default=300.0, help="seconds per rollout")
    apo.add_argument("--resume", action="store_true", help="continue the last run in OUTPUT_DIR")
    apo.add_argument("--seed", type=int, default=0)
    apo.add_argument("--output-dir", default="runs/apo", help="runs.db, metrics, prompts.json")
    apo.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


def apo(args: argparse.Namespace) -> int:
    """Run ``agl-lite apo``: load the agent and tasks, optimise, print the scores and the prompts file."""
    for name in ("budget", "minibatch_size", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CLIError(f"--{name.replace('_', '-')} must be >= 1", EXIT_USAGE)
    if (args.reflection_base_url is None) != (args.reflection_model is None):
        raise CLIError("--reflection-base-url and --reflection-model go together", EXIT_USAGE)
    agent, module = load_agent(args.agent)
    if args.data is not None:
        tasks = load_tasks(args.data, args.limit)
    elif hasattr(module, "load_dataset"):
        tasks = list(module.load_dataset("train", data_dir=args.data_dir))[: args.limit]
    else:
        raise CLIError("--data FILE is required (a .jsonl file or a .json list of tasks)", EXIT_USAGE)
    val = None
    if args.val_data is not None:
        val = load_tasks(args.val_data, args.val_limit)
    elif args.data is None and hasattr(module, "load_dataset"):
        val = list(module.load_dataset("val", data_dir=args.data_dir))[: args.val_limit]
    prepare_tasks(module, tasks + (val or []))

    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import RolloutConfig

    reflection: Any = "policy"
    if args.reflection_base_url is not None:
        reflection = agl.LLM(
            base_url=args.reflection_base_url,
            model=args.reflection_model,
            api_key=args.reflection_api_key or "agl-no-key",
        )
    algorithm = agl.APO(
        reflection=reflection,
        budget=args.budget,
        components=args.components,
        seed=args.seed,
        minibatch_size=args.minibatch_size,
        candidate_selection=args.selection,
    )
    where = (
        "the policy" if reflection == "policy" else f"{args.reflection_model} at {args.reflection_base_url}"
    )
    print_error(
        f"optimising the prompts of {args.agent} on {len(tasks)} tasks ({len(val or tasks)} to score): "
        f"policy {args.model}, reflection by {where}, budget {args.budget} rollouts, "
        f"output in {args.output_dir}"
    )
    t0 = time.time()
    trainer = agl.Trainer(
        model=args.model,
        algorithm=algorithm,
        engine=args.engine,
        air=air_rules(args),
        output_dir=args.output_dir,
        seed=args.seed,
        rollout_config=RolloutConfig(concurrency=args.concurrency, timeout=args.rollout_timeout),
        prompts=args.prompts,
    )
    try:
        result = trainer.fit(agent, tasks, val_dataset=val, resume=args.resume)
    finally:
        trainer.close()
    out = {
        "agent": args.agent,
        "seed_val_score": result["apo/seed_val_score"],
        "best_val_score": result["apo/best_val_score"],
        "candidates": int(result["apo/candidates"]),
        "metric_calls": int(result["apo/metric_calls"]),
        "rollouts_run": int(result["apo/rollouts_run"]),
        "prompts": result["prompts"],
        "prompts_file": str(Path(args.output_dir) / "prompts.json"),
        "store": str(Path(args.output_dir) / "runs.db"),
        "metrics": str(Path(args.output_dir) / "metrics.jsonl"),
        "wall_s": round(time.time() - t0, 1),
    }
    if args.json:
        print(json.dumps(out, indent=2, default=json_default))
        return EXIT_OK
    o = Out()
    o.table(
        "prompt optimisation done",
        ["", "value"],
        [
            ["validation score, starting prompts", fmt_num(out["seed_val_score"])],
            ["validation score, best prompts", fmt_num(out["best_val_score"])],
            ["candidates", str(out["candidates"])],
            ["rollouts run", str(out["rollouts_run"])],
        ],
    )
    for key, text in out["prompts"].items():
        o.line(f"{key}: {text}")
    for label in ("prompts_file", "store", "metrics"):
        o.line(f"{label:13s} {out[label]}")
    return EXIT_OK
