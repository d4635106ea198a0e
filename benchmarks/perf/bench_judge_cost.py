"""What an ``agl.rewards.Judge`` costs per rollout: calls and tokens (SmolLM2's tokenizer) scoring eight
replies to one GSM8K question one by one, and as one GRPO group in one call.

The judge is a PolicyServer whose scripted engine writes a one-line verdict, so the prompt side is
exact and the completion side is that of a judge that does not reason first (a real one writes more).

    python -m benchmarks.perf.bench_judge_cost      # prints the table docs/rewards.md shows
"""

from __future__ import annotations

from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

RUBRIC = "The reply solves the problem: the final number is correct and the working shows how it was reached."
TASK = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
REPLIES = [
    f"In April she sold 48 clips. In May she sold 48 / 2 = 24 clips. Altogether she sold 48 + 24 = {72 + i} "
    f"clips. The answer is {72 + i}."
    for i in range(8)
]


def judge_model(messages: list[dict[str, Any]]) -> str:
    if "numbered replies" in messages[0]["content"]:
        return "\n".join(f"Reply {i}: Score: {10 if i == 1 else 2}/10" for i in range(1, len(REPLIES) + 1))
    return "The working is right and the total is correct.\nScore: 9/10"


def main() -> None:
    with PolicyServer(engines.ScriptedEngine(judge_model)) as server:  # SmolLM2's tokenizer
        one = agl.rewards.Judge(RUBRIC, base_url=server.base_url, model=server.model_name)
        for reply in REPLIES:
            one(TASK, reply)
        group = agl.rewards.Judge(RUBRIC, base_url=server.base_url, model=server.model_name)
        group.score_group(TASK, REPLIES)
    print("| | calls per rollout | prompt tokens per rollout | completion tokens per rollout |")
    print("|---|---|---|---|")
    for name, judge in [("judge(task, reply)", one), (f"score_group, group of {len(REPLIES)}", group)]:
        cost = judge.usage.per_reply()
        calls, prompt, completion = cost["calls"], cost["prompt_tokens"], cost["completion_tokens"]
        print(f"| {name} | {calls:.3g} | {prompt:.1f} | {completion:.1f} |")


if __name__ == "__main__":
    main()
