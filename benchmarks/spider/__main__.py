"""Train the Spider SQL agent's writer and rewriter (checker frozen) and compare held-out accuracy.

    python -m benchmarks.spider --data-dir /work/shared/data --threads 1     # CPU defaults, ~15 min

At the paper's scale, on one GPU with LoRA and vLLM (see README.md):

    python -m benchmarks.spider --data-dir /work/shared/data \\
        --model meta-llama/Llama-3.2-3B-Instruct --engine vllm \\
        --train-size 0 --test-size 0 --max-schema-chars 0 \\
        --steps 400 --batch-size 32 --group-size 4 --lr 1e-5 --lora-r 32 \\
        --max-tokens 512 --max-turns 3 --concurrency 128 --rollout-timeout 1800

``--policies separate`` gives the writer and the rewriter each its own LoRA adapter on the shared base
model (``agl.Trainer(policies=...)``; the checker is served by the base model) instead of the paper's
one shared policy; the results row names the set-up. ``--train-size 0`` / ``--test-size 0`` take every
question of the split. Held-out execution accuracy
(Spider's, on databases never trained on) is measured before and after training with greedy
decoding; ``writer_acc`` is the accuracy of the writer's first query alone.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _harness
from .data import load_dataset
from .sql_agent import AIR, CREDIT, TRAINED_AGENTS, SpiderAgent
from .teacher import make_teacher


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.spider",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _harness.add_arguments(
        ap, train_size=16, test_size=16, steps=4, batch_size=4, group_size=4, lr=2e-4, max_tokens=64
    )
    ap.add_argument(
        "--max-turns", type=int, default=2, help="queries written per question (writer + rewrites)"
    )
    ap.add_argument(
        "--max-schema-chars",
        type=int,
        default=420,
        help="keep questions whose CREATE TABLE schema is at most this long (0: all; short prompts on CPU)",
    )
    ap.add_argument(
        "--policies",
        choices=["shared", "separate"],
        default="shared",
        help="shared: one LoRA for the writer and the rewriter (the paper's); separate: one each "
        "(the checker is served by the base model)",
    )
    args = ap.parse_args(argv)

    limit = args.max_schema_chars or None
    train = load_dataset("train", args.data_dir, max_schema_chars=limit, seed=args.seed)
    test = load_dataset("test", args.data_dir, max_schema_chars=limit)  # one fixed order for every seed
    sft_train = train[args.train_size : args.train_size + args.sft_tasks]  # disjoint from the RL tasks
    train = train[: args.train_size] if args.train_size > 0 else train
    test = test[: args.test_size] if args.test_size > 0 else test
    separate = args.policies == "separate"
    train_agent = SpiderAgent(
        max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=1.0, per_agent_endpoints=separate
    )
    eval_agent = dataclasses.replace(train_agent, temperature=0.0)
    dbs = sorted({t["db_id"] for t in train}), sorted({t["db_id"] for t in test})
    return _harness.run(
        "spider",
        args,
        train_agent=train_agent,
        eval_agent=eval_agent,
        train=train,
        test=test,
        trainer_options={**_policy_options(args), "air": AIR, "credit": CREDIT},
        argv=argv,
        variant=f"policies {args.policies}",
        teacher=lambda tasks: make_teacher(tasks, args.model),
        sft_train=sft_train,
        notes=(
            f"max_turns {args.max_turns}, max_tokens {args.max_tokens}, schemas <= {limit or 'any'} chars; "
            f"AIR {'off' if args.no_air else 'run_sql ok +0.1 / error -0.1'}; "
            f"train dbs {', '.join(dbs[0])}; test dbs {', '.join(dbs[1])}"
        ),
    )


def _policy_options(args: argparse.Namespace) -> dict[str, Any]:
    """``agents=`` for the paper's shared policy, or ``policies=`` with one adapter per trained role."""
    if args.policies == "shared":
        return {"agents": list(TRAINED_AGENTS)}
    import agentlightning_lite as agl

    lora = agl.LoRA(r=args.lora_r, alpha=2 * args.lora_r, load_in_4bit=args.load_in_4bit)
    return {"lora": None, "policies": {role: lora for role in TRAINED_AGENTS}}


if __name__ == "__main__":
    main()
