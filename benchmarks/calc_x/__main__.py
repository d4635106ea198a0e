"""Train and evaluate the Calc-X calculator agent: held-out accuracy before and after GRPO on LoRA.

    python -m benchmarks.calc_x --data-dir /work/shared/data        # CPU defaults, ~17 min on 2 shared cores

At the paper's scale on one GPU (see README.md):

    python -m benchmarks.calc_x --model meta-llama/Llama-3.2-3B-Instruct --engine vllm --select first \\
        --train-size 8192 --test-size 500 --steps 512 --batch-size 32 --group-size 4 --lr 1e-5 \\
        --lora-r 32 --max-tokens 512 --concurrency 128
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from .. import _harness
from .autogen_agent import AIR, CREDIT, make_agent
from .data import SELECTIONS, load_dataset, select
from .teacher import make_teacher


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse the command line, run the benchmark, return its results."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.calc_x",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _harness.add_arguments(
        ap, train_size=16, test_size=16, steps=4, batch_size=2, group_size=4, max_tokens=48
    )
    ap.add_argument(
        "--select",
        choices=("easiest", "first"),
        default="easiest",
        help="which questions: 'easiest' (numeric answer, fewest reference calculator steps, shortest "
        "question) or 'first' (file order: all subsets, multiple choice included)",
    )
    ap.add_argument(
        "--train-select",
        choices=SELECTIONS,
        default=None,
        help="which training questions (RL and warm start) when they should differ from --select: "
        "'word-problems' (one reference calculator step, stories of 12+ words; almost all ape210k)",
    )
    ap.add_argument(
        "--rl-select",
        choices=SELECTIONS,
        default=None,
        help="which GRPO training questions when they should differ from the warm start's (--train-select): "
        "'english' (one-step MAWPS/ASDiv/SVAMP/GSM8K stories, the held-out set's kind); never a warm-start "
        "question",
    )
    ap.add_argument("--max-tool-turns", type=int, default=3, help="calculator turns per episode")
    args = ap.parse_args(argv)
    train_all = load_dataset("train", args.data_dir)
    how = args.train_select or args.select
    train = select(train_all, args.train_size, how)
    # the warm start's tasks follow the RL tasks in the same order: disjoint from them and from the test
    sft_train = select(train_all, args.train_size + args.sft_tasks, how)[args.train_size :]
    if args.rl_select and args.rl_select != how:
        taught = {t["id"] for t in sft_train}
        pool = select(train_all, args.train_size + len(taught), args.rl_select)
        pool = [t for t in pool if t["id"] not in taught]
        train = pool[: args.train_size]  # never a question the warm start was shown
    test = select(load_dataset("test", args.data_dir), args.test_size, args.select)
    sampling = {"max_tokens": args.max_tokens, "max_tool_turns": args.max_tool_turns}
    return _harness.run(
        "calc_x",
        args,
        train_agent=make_agent(temperature=1.0, **sampling),
        eval_agent=make_agent(temperature=0.0, **sampling),
        train=train,
        test=test,
        trainer_options={"air": AIR, "credit": CREDIT},
        argv=argv,
        notes=(
            f"{args.select} test questions, {how} training questions"
            + (f", {args.rl_select} GRPO questions" if args.rl_select else "")
            + "; AIR calculator ok +0.1 / error -0.1; greedy evaluation"
        ),
        teacher=lambda tasks: make_teacher(tasks, args.model),
        sft_train=sft_train,
    )


if __name__ == "__main__":
    main()
