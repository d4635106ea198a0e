"""benchmarks/apo/bench_apo.py without a model: the APO budget that keeps an arm within its rollouts, the
results table, and merging results written by separate runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.apo import bench_apo


def args(**kw: int) -> argparse.Namespace:
    return argparse.Namespace(**{"rollouts": 64, "minibatch_size": 3, "apo_val": 8, **kw})


def test_the_apo_budget_leaves_room_for_the_probe_and_the_last_iteration() -> None:
    # 64 rollouts: 1 probe, and the last iteration may add 2 minibatches of 3 and the 8 validation tasks
    assert bench_apo.apo_budget("apo", args()) == 64 - 1 - 6 - 8
    assert bench_apo.apo_budget("apo+grpo", args()) == 32 - 1 - 6 - 8
    assert bench_apo.apo_budget("grpo", args()) == 0
    with pytest.raises(SystemExit, match="raise --rollouts"):
        bench_apo.apo_budget("apo+grpo", args(rollouts=40))


def row(arm: str, seed: int, before: int, after: int, **kw: object) -> dict:
    def ev(k: int) -> dict:
        return {"success_rate": k / 64, "mean_reward": k / 64, "n": 64, "failed": 0}

    return {
        "task": "demo",
        "arm": arm,
        "seed": seed,
        "before": ev(before),
        "after": ev(after),
        "train_rollouts": 64,
        "wall_s": 1.0,
        **kw,
    }


def test_results_render_per_seed_and_per_arm_and_merge(tmp_path: Path) -> None:
    inv = {
        "command": "python -m benchmarks.apo.bench_apo --tasks demo",
        "started": "s",
        "machine": "m",
        "load_start": "1.00 1.00 1.00",
    }
    apo = {
        "apo_rollouts": 60,
        "apo_seed_val": 0.5,
        "apo_best_val": 0.5,
        "apo_candidates": 1,
        "apo_reflection_calls": 3,
        "prompt_changed": False,
        "prompts": {"system": "Be exact."},
        "apo_proposals": [{"accepted": False, "minibatch": [1.0, 0.0], "prompts": {"system": "Cookies."}}],
    }
    doc = {"invocations": [inv], "rows": [row("grpo", 0, 32, 48, grpo_steps=2), row("apo", 0, 32, 32, **apo)]}
    md = bench_apo.render(doc)
    assert "| grpo | 0 | 0.500 (32/64) | 0.750 (48/64) | 64 (0 + 0) | 2 |" in md
    assert "| apo | 0 | 0.500 (32/64) | 0.500 (32/64) | 64 (60 + 0) | 0 | 0.500 -> 0.500 | 1 | 3 | no |" in md
    assert "| grpo | 0 | 0.500 | 0.750 | 0.250 |" in md
    assert "`system` (unchanged (the seed prompt)): `'Be exact.'`" in md
    assert "1 proposals, 0 accepted" in md and "minibatch 1.0 -> 0.0: `'Cookies.'`" in md
    # a run written elsewhere (another task) merges in; a row of the same task, arm and seed replaces
    other = {
        "invocations": [{**inv, "command": "calc_x"}],
        "rows": [row("grpo", 0, 1, 2), {**row("grpo", 1, 3, 4), "task": "calc_x"}],
    }
    (tmp_path / "other.json").write_text(json.dumps(other))
    results = tmp_path / "results.md"
    bench_apo.write(doc, results)
    rows = bench_apo.main(["--merge", str(tmp_path / "other.json"), "--results", str(results)])
    assert sorted((r["task"], r["arm"], r["seed"]) for r in rows) == [
        ("calc_x", "grpo", 1),
        ("demo", "apo", 0),
        ("demo", "grpo", 0),
    ]
    assert "## calc_x" in results.read_text() and "| grpo | 0 | 0.016 (1/64) |" in results.read_text()
    assert json.loads(results.with_suffix(".json").read_text())["invocations"][1]["command"] == "calc_x"


def test_training_rollouts_leave_out_the_reflection_models_trace_rollouts() -> None:
    """The reflection model's calls to the policy's server are recorded as ``trace`` rollouts: they are
    not training rollouts, so an arm's count leaves them out."""
    import agentlightning_lite as agl

    store = agl.MemoryStore()
    for mode in ("train", "train", "val", "trace", "trace"):
        store.start_rollout("t", mode=mode)
    assert bench_apo._task_rollouts(store) == 3
