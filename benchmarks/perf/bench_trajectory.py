"""Update time and peak memory per episode: ``SampleConfig(transitions="call")`` vs ``"trajectory"``.

A scripted multi-turn chat agent (each turn: one policy call, then a tool observation appended to the
history) runs 2, 5, 10 and 20 turns through the real pipeline: the PolicyServer serves its calls from
a ``ScriptedEngine`` with SmolLM2's tokenizer and chat template (so the prompt token ids are the ones a
chat agent sends), the spans become transitions, and ``agl.Trainer`` updates a LoRA adapter on the
embedded model (``smollm2-135m``, fp32, CPU). Per call, each call is a sample with its whole prompt
(the context paid once per call: quadratic in the turns); per trajectory, each episode is one
sequence. Each mode runs in its own fresh process, turns in increasing order, after one warm-up step.

    python -m benchmarks.perf.bench_trajectory --threads 1          # writes trajectory_results.md/.json
    python -m benchmarks.perf.bench_trajectory --turns 2 5 --threads 1 --out /tmp/t.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import cpu_model, load_average
from benchmarks.perf.bench_grpo_step import _git_state, _versions, peak_rss_mib, reset_peak_rss, rss_mib

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
MODEL = "smollm2-135m"
TARGET = 0.35  # trajectory update time / per-call update time at 10 turns

SYSTEM = "Look up one key per turn, then answer."
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]


def reply_for(messages: list[dict[str, Any]]) -> str:
    """The scripted assistant turn: a tool request (about 10 tokens)."""
    turn = sum(1 for m in messages if m["role"] == "assistant")
    return f"Turn {turn + 1}: look up {WORDS[turn % len(WORDS)]}."


def observation(turn: int, rng: random.Random) -> str:
    """The tool's answer appended after each call (about 8 tokens)."""
    return f"{WORDS[turn % len(WORDS)]} = {rng.randint(1000, 9999)}, ok."


def run_worker(mode: str, turns: list[int], episodes: int, threads: int | None, seed: int) -> dict[str, Any]:
    """One process, one mode: a warm-up step, then one timed step per number of turns."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    import agentlightning_lite as agl
    from agentlightning_lite.rl.config import LoggingConfig, SampleConfig, UpdateConfig
    from agentlightning_lite.serving.engines import ScriptedEngine

    class Served(ScriptedEngine):
        """The scripted engine serves; the trainer's transformers copy trains (no weights to load here)."""

        def update_weights(self, source: Any) -> int:
            self.version += 1
            return self.version

    n_turns = {"turns": 2}

    def agent(task: dict[str, Any], llm: agl.LLM) -> float:
        rng = random.Random(task["seed"])
        client = llm.openai_client()
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task["question"]},
        ]
        for k in range(n_turns["turns"]):
            reply = client.chat.completions.create(model=llm.model, max_tokens=64, messages=messages)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": observation(k, rng)})
        return random.Random(llm.rollout_id).random()  # a spread within each group: every step has a gradient

    tasks = [{"question": "Find the total of the keys alpha to omega.", "seed": seed}]
    out: dict[str, Any] = {"mode": mode, "threads": torch.get_num_threads(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="agl-bench-traj-") as tmp:
        t0 = time.perf_counter()
        trainer = agl.Trainer(
            model=MODEL,
            engine=Served(reply_for, tokenizer=MODEL, model_name=MODEL),
            algorithm=agl.GRPO(group_size=episodes, lr=1e-4),
            lora=agl.LoRA(r=16, alpha=32),
            batch_size=1,
            store=agl.MemoryStore(),
            output_dir=tmp,
            logging_config=LoggingConfig(loggers=[]),
            seed=seed,
            # the engine's logprobs, as "auto" uses them when they agree with the model: no extra
            # no-grad pass (the scripted engine's are not the model's, which changes no cost)
            update_config=UpdateConfig(old_logprobs="engine"),
            sample_config=SampleConfig(max_seq_len=4096, transitions=mode),
        )
        out["load_s"] = time.perf_counter() - t0
        update = trainer.learner.learn
        peaks: dict[str, float] = {}

        def tracked(samples: Any, *a: Any, **kw: Any) -> Any:
            reset_peak_rss()
            peaks["before"] = rss_mib()
            try:
                return update(samples, *a, **kw)
            finally:
                peaks["peak"] = peak_rss_mib()

        trainer.learner.learn = tracked  # type: ignore[method-assign]
        with trainer.rollouts.serving():
            for k, n in enumerate([2, *turns]):
                n_turns["turns"] = n
                m = trainer.train_step(agent, [(0, {**tasks[0], "seed": seed + k})])
                if k == 0:
                    continue  # warm-up
                row = {
                    "turns": n,
                    "episodes": episodes,
                    "update_s": m["time/update_s"],
                    "update_s_per_episode": m["time/update_s"] / episodes,
                    "peak_rss_mib": peaks["peak"],
                    "rss_before_mib": peaks["before"],
                    "calls": m["train/samples"],
                    "sequences": m.get("train/sequences", float("nan")),
                    "sequence_tokens": m.get("train/sequence_tokens", float("nan")),
                    "trained_tokens": m.get("train/response_tokens", float("nan")),
                    "prefix_mismatches": m.get("trajectory/prefix_mismatches", 0.0),
                    "loss": m.get("train/loss", float("nan")),
                }
                out["rows"].append(row)
                print(json.dumps({"mode": mode, **row}), file=sys.stderr, flush=True)
        trainer.close()
    return out


def spawn(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = Path(f.name)
    cmd = [sys.executable, "-m", "benchmarks.perf.bench_trajectory", "--worker", mode, "--json", str(path)]
    cmd += ["--turns", *map(str, args.turns), "--episodes", str(args.episodes), "--seed", str(args.seed)]
    if args.threads is not None:
        cmd += ["--threads", str(args.threads)]
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=1800)
    res = json.loads(path.read_text())
    path.unlink()
    return res


def table(call: dict[str, Any], traj: dict[str, Any]) -> str:
    lines = [
        "| turns | update s / episode, per call | trajectory | trajectory / per call "
        "| peak RSS in update (MiB), per call | trajectory | tokens forwarded, per call | trajectory "
        "| trained tokens | prefix mismatches |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a, b in zip(call["rows"], traj["rows"], strict=True):
        ratio = b["update_s_per_episode"] / a["update_s_per_episode"]
        lines.append(
            f"| {a['turns']} | {a['update_s_per_episode']:.2f} | {b['update_s_per_episode']:.2f} | "
            f"**{ratio:.2f}x** | {a['peak_rss_mib']:.0f} | {b['peak_rss_mib']:.0f} | "
            f"{a['sequence_tokens']:.0f} | {b['sequence_tokens']:.0f} | {b['trained_tokens']:.0f} | "
            f"{b['prefix_mismatches']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, nargs="+", default=[2, 5, 10, 20])
    ap.add_argument("--episodes", type=int, default=2, help="episodes per step (the GRPO group)")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "trajectory_results.md")
    ap.add_argument("--worker", choices=["call", "trajectory"], help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        res = run_worker(args.worker, args.turns, args.episodes, args.threads, args.seed)
        args.json.write_text(json.dumps(res))
        return

    load_before, t_all = load_average(), time.perf_counter()
    call = spawn("call", args)
    traj = spawn("trajectory", args)
    minutes = (time.perf_counter() - t_all) / 60
    tab = table(call, traj)
    at10 = [(a, b) for a, b in zip(call["rows"], traj["rows"], strict=True) if a["turns"] == 10]
    verdict = ""
    if at10:
        a, b = at10[0]
        r = b["update_s_per_episode"] / a["update_s_per_episode"]
        verdict = (
            f"**Verdict:** at 10 turns the trajectory update takes {r:.2f}x the per-call time "
            f"(target at most {TARGET}x: {'met' if r <= TARGET else 'NOT met'})."
        )
    print(f"\n{tab}\n\n{verdict}")
    cmd = "python -m benchmarks.perf.bench_trajectory"
    if args.turns != [2, 5, 10, 20]:
        cmd += " --turns " + " ".join(map(str, args.turns))
    if args.episodes != 2:
        cmd += f" --episodes {args.episodes}"
    if args.threads is not None:
        cmd += f" --threads {args.threads}"
    v = _versions()
    md = f"""# Multi-turn update cost: per-call samples vs one sequence per episode

Command (from the repository root): `{cmd}`

Date {dt.date.today()}; machine: {cpu_model()}, {os.cpu_count()} CPU cores, no GPU; Python \
{platform.python_version()}, torch {v["torch"]} ({call["threads"]} threads), transformers \
{v["transformers"]}, peft {v["peft"]}; agentlightning-lite at {_git_state()}. Load average \
(1/5/15 min) at start: {load_before}; at end: {load_average()} (a machine shared with other \
engineers' jobs). Benchmark wall time {minutes:.1f} min.

**Setup.** A scripted chat agent: system prompt + task, then per turn one call to the PolicyServer \
(a `ScriptedEngine` with SmolLM2's tokenizer and chat template answers "Turn k: look up \
<key>.") and a tool observation appended as a user message. Reward: random per episode (GRPO \
needs a spread). `agl.Trainer(model="{MODEL}", algorithm=agl.GRPO(group_size={args.episodes}, lr=1e-4), \
lora=agl.LoRA(r=16, alpha=32), batch_size=1, update_config=UpdateConfig(old_logprobs="engine"), \
sample_config=SampleConfig(transitions=...))`: \
the training copy is SmolLM2-135M-Instruct in fp32 on CPU; one step = {args.episodes} episodes of the \
same task, one optimiser step; defaults otherwise (micro-batches of at most 8 samples and 2048 padded \
tokens, one forward + backward each). `old_logprobs="engine"` takes the importance-ratio denominator \
from the spans, as the default `"auto"` does once the engine's logprobs agree with the model (the \
scripted engine's are constant, which changes the ratio's value but not the cost of the update).

**Method.** `transitions="call"` and `transitions="trajectory"` each in a fresh process; in each, a \
2-turn warm-up step, then one step per number of turns in increasing order. Update time: \
`time/update_s` of the step (advantages, merging, the forward/backward passes and the AdamW step; the \
rollouts are not included), divided by the episodes. Peak RSS: the kernel's high-water mark (VmHWM) \
reset through `/proc/self/clear_refs` when the update starts, read when it ends (the process's \
resident memory, model and adapter included). Tokens forwarded: prompt + response tokens of all \
training sequences of the step. Trained tokens and prefix mismatches: the trajectory run's (the \
per-call run trains the same tokens).

{tab}

{verdict}
"""
    args.out.write_text(md)
    args.out.with_suffix(".json").write_text(
        json.dumps({"command": cmd, "date": str(dt.date.today()), "call": call, "trajectory": traj}, indent=1)
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")


if __name__ == "__main__":
    main()
