"""Train a tool-using arithmetic agent on the embedded SmolLM2-135M, on CPU, and compare before/after.

    python examples/quickstart.py                 # the README's main command (see benchmarks/learning)
    python examples/quickstart.py --steps 2 --eval-size 8     # a quick look
    python examples/quickstart.py --engine vllm               # the same run served by vLLM (docs/gpu.md)
    python examples/quickstart.py --async-rollouts            # rollouts run ahead of the update (k=1)

The agent (``examples/calc_agent.py``) is ordinary ``openai``-client code with a calculator tool.
Every LLM call goes through the PolicyServer, lands in ``runs/quickstart/runs.db`` with its exact
token ids, and GRPO updates a LoRA adapter on those calls. Held-out success rate is measured before
and after training on tasks never trained on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from calc_agent import calc_agent, make_tasks

import agentlightning_lite as agl
from agentlightning_lite.rl.config import RolloutConfig, SampleConfig


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch-size", type=int, default=4, help="tasks per step")
    ap.add_argument("--group-size", type=int, default=8, help="rollouts per task (GRPO group)")
    ap.add_argument("--eval-size", type=int, default=32, help="held-out tasks for before/after")
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output-dir", default="runs/quickstart")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument(
        "--engine",
        choices=["auto", "hf", "vllm"],
        default="auto",
        help="what serves the policy: the in-process HF engine, or a vLLM server the engine starts",
    )
    ap.add_argument(
        "--vllm-url", help="with --engine vllm: attach to this running vLLM instead of starting one"
    )
    ap.add_argument(
        "--async-rollouts",
        action="store_true",
        help="roll out the next steps while the learner updates (docs/training.md)",
    )
    ap.add_argument(
        "--max-staleness",
        type=int,
        default=None,
        help="with --async-rollouts: train on rollouts at most this many versions old (default 1)",
    )
    args = ap.parse_args(argv)

    t0 = time.time()
    train = make_tasks(args.steps * args.batch_size, seed=1000 + args.seed)
    held_out = make_tasks(args.eval_size, seed=args.seed)  # different seeds: no overlap in practice
    trainer = agl.Trainer(
        model="smollm2-135m",
        algorithm=agl.GRPO(group_size=args.group_size, lr=args.lr, micro_batch_size=16),
        lora=agl.LoRA(r=16, alpha=32),
        air=[agl.air.ToolStatus(success=0.1, error=-0.1)],
        credit=agl.credit.Discounted(1.0),
        engine=args.engine,
        engine_options={"url": args.vllm_url} if args.vllm_url else None,
        batch_size=args.batch_size,
        # a slow or shared CPU must not turn rollouts into timeouts
        rollout_config=RolloutConfig(timeout=1800, async_rollouts=args.async_rollouts),
        sample_config=SampleConfig(max_staleness=args.max_staleness),
        output_dir=args.output_dir,
        seed=args.seed,
    )

    def greedy(task, llm):
        return calc_agent(task, llm, temperature=0.0)

    before = trainer.evaluate(greedy, held_out)
    print(f"before training: success rate {before['success_rate']:.1%} on {before['n']} held-out tasks")
    trainer.fit(calc_agent, train, steps=args.steps)
    after = trainer.evaluate(greedy, held_out)
    n = after["n"]
    print(f"after {args.steps} steps:  success rate {after['success_rate']:.1%} on {n} held-out tasks")
    out = {
        "seed": args.seed,
        "steps": args.steps,
        "async_rollouts": args.async_rollouts,
        "before": before,
        "after": after,
        "wall_s": round(time.time() - t0, 1),
        "store": str(Path(args.output_dir) / "runs.db"),
        "reward_curve": str(trainer.plot()),
        "adapter": str(trainer.save()),
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))
    trainer.close()
    return out


if __name__ == "__main__":
    main()
