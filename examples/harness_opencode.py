"""Train opencode, unchanged, with GRPO: one process per rollout, sandboxed, its calls the training data.

Needs Linux with `unshare` (root or user namespaces) and opencode (`npm install opencode-ai@1.18.33`,
or tests/harness/install_clis.sh). The embedded 135M model only shows the plumbing (docs/harnesses.md):

    python examples/harness_opencode.py --opencode ~/.cache/agl-harness-clis/node_modules/.bin/opencode
"""

from __future__ import annotations

import argparse

import agentlightning_lite as agl
from agentlightning_lite.harness import opencode
from agentlightning_lite.rl.config import SampleConfig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--opencode", default="opencode", help="the opencode executable")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()

    # the reward: did the run leave hi.txt saying hello? (a verifier command would do as well)
    def reward(result: agl.harness.HarnessResult) -> float:
        hi = result.workdir / "hi.txt"
        return 1.0 if hi.exists() and "hello" in hi.read_text().lower() else 0.0

    agent = opencode(
        executable=args.opencode,
        system_prompt="You are a coding agent. Use the tools to do the task, then answer briefly.",
        tools=["bash", "read", "write", "edit"],  # a short prompt: the embedded model has 8192 tokens
        max_output=64,
        timeout=300,
        reward=reward,
    )
    trainer = agl.Trainer(
        model=args.model,
        algorithm=agl.GRPO(group_size=2),
        batch_size=1,
        sample_config=SampleConfig(max_seq_len=4096),
        output_dir="runs/harness-opencode",
    )
    with trainer:
        metrics = trainer.fit(agent, ["Write hello to a file named hi.txt."], steps=args.steps)
    print({k: v for k, v in metrics.items() if k.startswith(("train/", "rollout/"))})


if __name__ == "__main__":
    main()
