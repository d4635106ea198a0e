"""A newcomer's first ``trainer.fit(env.agent, env.tasks)`` with every default, timed on this machine.

    python -m benchmarks.learning_rg.first_fit --steps 2 --threads 1

What it runs is what docs/environments.md and docs/training.md show, with nothing set:

    env = agl.envs.ReasoningGym("basic_arithmetic", size=64, seed=0)   # max_tokens=512, stops at </answer>
    trainer = agl.Trainer(model="smollm2-135m", output_dir=...)          # GRPO, 8 tasks x 8 rollouts a step
    trainer.fit(env.agent, env.tasks, steps=2)

and it records what the user would see: the rollout timeout the trainer sized before the first step, each
step's wall time, rollouts that failed or timed out, replies cut at ``max_tokens``, the reply lengths,
the training reward, the machine and its load. One JSON file (``results/first_fit/<date>.json``) and the
table ``first_fit.md`` rewritten from every such file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "first_fit"
TABLE = HERE / "first_fit.md"
KEYS = (
    "train/reward_mean",
    "train/failed_rollouts",
    "train/timeout_rollouts",
    "samples/truncated",
    "train/response_tokens",
    "train/samples",
    "time/rollouts_s",
    "time/update_s",
)


class _Collect(logging.Handler):
    """Keeps the trainer's log lines about the rollout timeout (what the user reads before step 1)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "timeout" in msg.lower() or "rollout takes" in msg.lower():
            self.lines.append(msg)


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import agentlightning_lite as agl

    if args.threads:
        torch.set_num_threads(args.threads)
    collect = _Collect()
    logging.getLogger("agentlightning_lite").addHandler(collect)
    logging.getLogger("agentlightning_lite").setLevel(logging.INFO)
    out_dir = Path(args.work_dir)
    env = agl.envs.ReasoningGym("basic_arithmetic", size=64, seed=0)
    t0 = time.time()
    trainer = agl.Trainer(model="smollm2-135m", output_dir=str(out_dir))
    load_s = time.time() - t0
    steps: list[float] = []
    for k in range(1, args.steps + 1):
        t1 = time.time()
        trainer.fit(env.agent, env.tasks, steps=k)
        steps.append(round(time.time() - t1, 1))
    metrics = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    per_step = [{k: m.get(k) for k in KEYS} for m in metrics if "train/reward_mean" in m]
    timeout_s = trainer.rollout_config.timeout_s
    trainer.close()
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": f"python -m benchmarks.learning_rg.first_fit --steps {args.steps}"
        + (f" --threads {args.threads}" if args.threads else ""),
        "env": {"name": "basic_arithmetic", "size": 64, "max_tokens": env.max_tokens, "stop": env.stop},
        "trainer": {"batch_size": trainer.batch_size, "group_size": trainer.algorithm.group_size},
        "rollout_timeout_s": timeout_s,
        "timeout_log": collect.lines,
        "load_s": round(load_s, 1),
        "step_wall_s": steps,
        "per_step": per_step,
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "processor": platform.processor() or platform.machine(),
        },
        "load_avg": os.getloadavg(),
    }


def table() -> str:
    rows = [
        "# A first `trainer.fit(env.agent, env.tasks)` with every default",
        "",
        '`agl.envs.ReasoningGym("basic_arithmetic", size=64, seed=0)` (its agent: `max_tokens=512`,',
        'stops at `</answer>`) and `agl.Trainer(model="smollm2-135m")` (GRPO with its default tasks and',
        "rollouts a step), nothing else set. Rewritten from `results/first_fit/*.json` by",
        "`python -m benchmarks.learning_rg.first_fit`.",
        "",
        "| date | tasks x rollouts a step | torch threads | load avg (1 min) | rollout timeout sized "
        "| step wall s "
        "| failed / timed out (why) | cut at max_tokens | mean reply tokens | train reward |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    command = None
    for path in sorted(RESULTS.glob("*.json")):
        r = json.loads(path.read_text())
        ps = r["per_step"]
        failed = "; ".join(
            f"{s.get('train/failed_rollouts') or 0:.0f} / {s.get('train/timeout_rollouts') or 0:.0f}"
            for s in ps
        )
        cut = "; ".join(
            f"{s.get('samples/truncated') or 0:.0f}/{s.get('train/samples') or 0:.0f}" for s in ps
        )
        toks = "; ".join(
            f"{s['train/response_tokens'] / max(1.0, s.get('train/samples') or 1):.0f}"
            if s.get("train/response_tokens")
            else "-"
            for s in ps
        )
        reward = "; ".join(f"{s.get('train/reward_mean') or 0:.3f}" for s in ps)
        rows.append(
            f"| {r['date'][:16]} | {r['trainer']['batch_size']} x {r['trainer']['group_size']} "
            f"| {r['machine']['torch_threads']} of {r['machine']['cpus']} cores "
            f"| {r['load_avg'][0]:.1f} | {r['rollout_timeout_s']:.0f} s "
            f"| {'; '.join(map(str, r['step_wall_s']))} "
            f"| {failed}{' (' + r['note'] + ')' if r.get('note') else ''} | {cut} | {toks} | {reward} |"
        )
        command = r["command"]
    if command:
        rows += ["", f"Command: `{command}` (from the repository root)."]
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--work-dir", default="runs/first_fit")
    args = ap.parse_args(argv)
    res = run(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{res['date'][:19].replace(':', '')}.json").write_text(json.dumps(res, indent=2))
    TABLE.write_text(table())
    print(TABLE.read_text())


if __name__ == "__main__":
    main()
