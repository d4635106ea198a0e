"""Synchronous vs asynchronous rollouts: steps per hour and the learner's idle share.

``agl.Trainer`` on a small model on the CPU (``--model tiny``, the default: a random-init 4-layer
Llama, hidden size 256, over a byte tokenizer, so that a run takes seconds on a shared CPU; or
``--model smollm2-135m``), fp32, LoRA r=8, GRPO with 2 tasks x 2 samples per step, trains the same
agent three ways: alternating (``async_rollouts=False``), and with
a producer thread rolling out ahead with ``max_staleness`` 1 and 2. Two agents: (a) ``tool``: one
policy call, a tool that sleeps ``--tool-s`` seconds, a second call (rollouts dominated by waiting);
(b) ``compute``: two policy calls back to back (rollouts dominated by generation, which shares the
CPU and the engine's lock with the update). All six runs share one engine and run in one process,
one after another, each for ``--steps`` steps after a one-step warm-up of its own trainer.

Learner idle share: the seconds the learner waited for rollouts over the run's wall time
(``time/learner_wait_s`` when asynchronous; the whole rollout phase, ``time/rollouts_s``, when not).

    python -m benchmarks.perf.bench_async                 # writes async_results.md and .json
    python -m benchmarks.perf.bench_async --steps 3 --out /tmp/async.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig, SampleConfig
from benchmarks._harness import cpu_model, load_average
from benchmarks.perf.bench_grpo_step import _git_state, _versions

HERE = Path(__file__).resolve().parent
MODES: list[tuple[str, bool, int | None]] = [
    ("sync", False, None),
    ("async k=1", True, 1),
    ("async k=2", True, 2),
]
TOKENS = 16
TASKS = [{"q": f"Name a fact about the number {i}."} for i in range(16)]


def make_agent(kind: str, tool_s: float) -> Any:
    def agent(task: dict[str, Any], llm: agl.LLM) -> float:
        client = llm.openai_client()
        messages = [{"role": "user", "content": task["q"]}]
        first = client.chat.completions.create(model=llm.model, max_tokens=TOKENS, messages=messages)
        if kind == "tool":
            time.sleep(tool_s)  # the tool: a lookup that waits on the network
        messages += [
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "And one more."},
        ]
        second = client.chat.completions.create(model=llm.model, max_tokens=TOKENS, messages=messages)
        return len(set(second.choices[0].message.content or "")) / 16.0

    return agent


def run_one(
    engine: Any, kind: str, mode: tuple[str, bool, int | None], steps: int, tool_s: float
) -> dict[str, Any]:
    label, is_async, k = mode
    random.seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = agl.Trainer(
            engine=engine,
            algorithm=agl.GRPO(group_size=2, lr=1e-4),
            batch_size=2,
            store=agl.MemoryStore(),
            output_dir=tmp,
            rollout_config=RolloutConfig(async_rollouts=is_async),
            sample_config=SampleConfig(max_staleness=k),
            logging_config=LoggingConfig(loggers=[]),
        )
        agent = make_agent(kind, tool_s)
        trainer.fit(agent, TASKS, steps=1)  # warm-up
        t0 = time.perf_counter()
        trainer.fit(agent, TASKS, steps=1 + steps)
        wall = time.perf_counter() - t0
        rows = [r for r in trainer.metrics.rows() if r.get("step", 0) > 1]
        trainer.close()
    wait_key = "time/learner_wait_s" if is_async else "time/rollouts_s"
    waited = sum(float(r.get(wait_key, 0.0)) for r in rows)
    ages = [float(r.get("async/staleness_mean", 0.0)) for r in rows]
    return {
        "agent": kind,
        "mode": label,
        "steps": len(rows),
        "wall_s": wall,
        "steps_per_hour": len(rows) / wall * 3600,
        "learner_idle_share": waited / wall,
        "update_s_mean": sum(float(r["time/update_s"]) for r in rows) / len(rows),
        "rollouts_s_mean": sum(float(r["time/rollouts_s"]) for r in rows) / len(rows),
        "staleness_mean": sum(ages) / len(ages) if ages else 0.0,
        "dropped_stale": sum(float(r.get("async/dropped_stale", 0.0)) for r in rows),
    }


def table(results: list[dict[str, Any]]) -> str:
    head = (
        "| agent | mode | steps | wall s | steps / hour | vs sync | learner idle share | "
        "update s / step | rollouts s / step | staleness mean | dropped stale |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for r in results:
        base = next(x for x in results if x["agent"] == r["agent"] and x["mode"] == "sync")
        lines.append(
            f"| {r['agent']} | {r['mode']} | {r['steps']} | {r['wall_s']:.1f} | {r['steps_per_hour']:.0f} | "
            f"{r['steps_per_hour'] / base['steps_per_hour']:.2f}x | {r['learner_idle_share']:.2f} | "
            f"{r['update_s_mean']:.2f} | {r['rollouts_s_mean']:.2f} | {r['staleness_mean']:.2f} | "
            f"{r['dropped_stale']:.0f} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="timed steps per run (after a warm-up step)")
    ap.add_argument("--tool-s", type=float, default=2.0, help="seconds the tool agent's tool sleeps")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the engine")
    ap.add_argument("--model", default="tiny", help="'tiny' (random-init, byte tokenizer) or a model name")
    ap.add_argument("--out", type=Path, default=HERE / "async_results.md")
    args = ap.parse_args()
    from agentlightning_lite.serving.engines import HFEngine

    load0 = load_average()
    started = time.perf_counter()
    lora = agl.LoRA(r=8, alpha=16)
    if args.model == "tiny":
        from tests._helpers import tiny_llama

        from agentlightning_lite.serving.tokenizer import ByteTokenizer

        model = tiny_llama(
            hidden_size=256, intermediate_size=512, num_hidden_layers=4, max_position_embeddings=4096
        )
        engine = HFEngine(
            model, tokenizer=ByteTokenizer(), model_name="tiny", lora=lora, seed=0, num_threads=args.threads
        )
    else:
        engine = HFEngine(args.model, lora=lora, seed=0, num_threads=args.threads)
    results = []
    for kind in ("tool", "compute"):
        for mode in MODES:
            results.append(run_one(engine, kind, mode, args.steps, args.tool_s))
            print(json.dumps(results[-1]), flush=True)
    engine.close()
    minutes = (time.perf_counter() - started) / 60
    versions = _versions()
    cmd = (
        "python -m benchmarks.perf.bench_async"
        + (f" --steps {args.steps}" if args.steps != 6 else "")
        + (f" --tool-s {args.tool_s:g}" if args.tool_s != 2.0 else "")
    )
    setup = " ".join(__doc__.split("\n\n")[1].split()).replace("``", "`")
    text = (
        "# Asynchronous rollouts: steps per hour and learner idle share\n\n"
        f"Command (from the repository root): `{cmd}`\n\n"
        f"Date {dt.date.today()}; machine: {cpu_model()}, {os.cpu_count()} CPU cores, no GPU; Python "
        f"{platform.python_version()}, torch "
        f"{versions['torch']} ({args.threads} thread), transformers {versions['transformers']}, peft "
        f"{versions['peft']}; agentlightning-lite at {_git_state()}. Load average (1/5/15 min) at start: "
        f"{load0}; at end: {load_average()}. Benchmark wall time {minutes:.1f} min. The machine is a "
        f"{os.cpu_count()}-core CPU shared with other people's jobs: the numbers are noisy.\n\n"
        f"**Setup.** {setup} The tool sleeps {args.tool_s:g} s; each "
        f"call asks for at most {TOKENS} tokens. {args.steps} timed steps per run.\n\n" + table(results)
    )
    args.out.write_text(text)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
