"""Train the Spider SQL agent's writer and rewriter (checker frozen) and compare held-out accuracy.

    python -m benchmarks.spider --data-dir /work/shared/data --threads 1     # CPU defaults, ~15 min

At the paper's scale, on one GPU with LoRA and vLLM (see README.md):

    python -m benchmarks.spider --data-dir /work/shared/data \\
        --model meta-llama/Llama-3.2-3B-Instruct --engine vllm \\
        --train-size 0 --test-size 0 --max-schema-chars 0 \\
        --steps 400 --batch-size 32 --group-size 4 --lr 1e-5 --lora-r 32 \\
        --max-tokens 512 --max-turns 3 --concurrency 128 --rollout-timeout 1800

``--train-size 0`` / ``--test-size 0`` take every question of the split. Held-out execution accuracy
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
from .sql_agent import TRAINED_AGENTS, SpiderAgent


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
    args = ap.parse_args(argv)

    limit = args.max_schema_chars or None
    train = load_dataset("train", args.data_dir, max_schema_chars=limit, seed=args.seed)
    test = load_dataset("test", args.data_dir, max_schema_chars=limit)  # one fixed order for every seed
    train = train[: args.train_size] if args.train_size > 0 else train
    test = test[: args.test_size] if args.test_size > 0 else test
    train_agent = SpiderAgent(max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=1.0)
    eval_agent = dataclasses.replace(train_agent, temperature=0.0)
    dbs = sorted({t["db_id"] for t in train}), sorted({t["db_id"] for t in test})
    return _harness.run(
        "spider",
        args,
        train_agent=train_agent,
        eval_agent=eval_agent,
        train=train,
        test=test,
        trainer_options={"agents": list(TRAINED_AGENTS)},
        argv=argv,
        notes=(
            f"max_turns {args.max_turns}, max_tokens {args.max_tokens}, schemas <= {limit or 'any'} chars; "
            f"train dbs {', '.join(dbs[0])}; test dbs {', '.join(dbs[1])}"
        ),
    )


if __name__ == "__main__":
    main()
