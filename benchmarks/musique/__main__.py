"""Train and evaluate the MuSiQue RAG agent: before/after answer F1 on held-out dev questions.

CPU (the embedded 135M model, about 15 minutes on 2 busy cores)::

    python -m benchmarks.musique --data-dir /work/shared/data --threads 1

One GPU at the paper's scale (LoRA, vLLM; see benchmarks/musique/README.md)::

    python -m benchmarks.musique --model meta-llama/Llama-3.2-3B-Instruct --engine vllm \\
        --train-size 100 --test-size 200 --steps 50 --batch-size 16 --group-size 4 --lr 1e-5 \\
        --max-tokens 512 --top-k 3 --words 0 --max-turns 5 --data-dir /work/shared/data
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

from .. import _harness
from . import load_dataset, make_agent
from .retriever import get_retriever
from .teacher import make_teacher


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.musique", description=__doc__.splitlines()[0])
    _harness.add_arguments(
        ap, train_size=16, test_size=16, steps=4, batch_size=4, group_size=4, max_tokens=64
    )
    ap.add_argument(
        "--retriever", default="auto", help="auto | minilm | bm25 | a local embedding model dir (e.g. BGE)"
    )
    ap.add_argument(
        "--scope",
        choices=("pooled", "question"),
        default="pooled",
        help="search the split's whole corpus (default) or only the question's own 20 paragraphs",
    )
    ap.add_argument("--top-k", type=int, default=2, help="paragraphs per search")
    ap.add_argument("--words", type=int, default=80, help="words kept per paragraph (0: all)")
    ap.add_argument("--max-turns", type=int, default=3, help="model calls per question")
    args = ap.parse_args(argv)
    if args.threads is not None:  # before the index is built (its encoder runs on torch too)
        import torch

        torch.set_num_threads(args.threads)

    rng = random.Random(args.seed)
    train = load_dataset("train", args.data_dir)
    test = load_dataset("dev", args.data_dir)
    pool = rng.sample(train, len(train))
    train = pool[: args.train_size]
    sft_train = pool[args.train_size : args.train_size + args.sft_tasks]  # disjoint from the RL tasks
    # one fixed held-out sample for every seed (the seed picks the training questions and sampling)
    test = random.Random(0).sample(test, min(args.test_size, len(test)))
    for tasks in (train, test):  # build (or load) the split's index before any rollout is timed
        get_retriever(tasks[0]["corpus"], args.retriever)

    settings = {
        "retriever": args.retriever,
        "scope": args.scope,
        "top_k": args.top_k,
        "words": args.words,
        "max_turns": args.max_turns,
        "max_tokens": args.max_tokens,
    }
    retriever = get_retriever(test[0]["corpus"], args.retriever).name
    return _harness.run(
        "musique",
        args,
        train_agent=make_agent(**settings, temperature=1.0),
        eval_agent=make_agent(**settings, temperature=0.0),
        train=train,
        test=test,
        argv=argv,
        teacher=lambda tasks: make_teacher(tasks, args.max_turns, args.model),
        sft_train=sft_train,
        notes=(
            f"retriever {retriever}, scope {args.scope}, top-{args.top_k} x {args.words or 'all'} words, "
            f"max {args.max_turns} turns; reward 0.1*format + 0.9*F1; success = reward 1.0 (F1 = 1)"
        ),
    )


if __name__ == "__main__":
    main()
