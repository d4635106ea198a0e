"""``python -m benchmarks.learning_rg``: the results say which cells are measured, with spread and noise."""

from __future__ import annotations

import doctest
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.learning_rg import __main__ as bench  # noqa: E402


@pytest.mark.slow  # imports the SDK and reasoning-gym and builds a dataset: several seconds on a loaded CPU
def test_doctests() -> None:
    assert doctest.testmod(bench).failed == 0


def run(config: str, seed: int, after: float, rewards: list[float], **curves: list[Any]) -> dict[str, Any]:
    return {
        "task": "arith3",
        "config": config,
        "seed": seed,
        "steps": len(rewards),
        "batch_size": 2,
        "group_size": 8,
        "lr": 2e-4,
        "max_tokens": 128,
        "prompt": "short",
        "after": {"success_rate": after, "mean_reward": after, "n": 48, "failed": 0},
        "curves": {"train/reward_mean": rewards, **curves},
        "wall_s": 600.0,
        "load_avg": [3.0, 3.0, 3.0],
    }


def args(tmp_path: Path, *extra: str) -> Any:
    import argparse

    ns = argparse.Namespace(
        task="arith3",
        configs=["grpo-sync", "ppo-sync", "grpo-async"],
        seeds=[0, 1, 2],
        steps=3,
        batch_size=2,
        group_size=8,
        lr=2e-4,
        max_tokens=128,
        eval_size=48,
        eval_seed=10_000,
        max_staleness=1,
        threads=None,
        prompt="short",
        shots=0,
        results_dir=str(tmp_path / "results"),
        out_dir=str(tmp_path),
    )
    return ns


def test_report_marks_missing_cells_and_compares_by_seed(tmp_path: Path) -> None:
    a = args(tmp_path)
    folder = tmp_path / "results" / "arith3-short"
    folder.mkdir(parents=True)
    (folder / "before.json").write_text(
        json.dumps({"before": {"success_rate": 12 / 48, "n": 48, "mean_reward": 0.25, "failed": 0}})
    )
    for r in (
        run("grpo-sync", 0, 24 / 48, [0.2, 0.4, 0.5], **{"samples/truncated": [3, 1, 0]}),
        run("grpo-sync", 1, 18 / 48, [0.2, 0.3, 0.3]),
        run("ppo-sync", 0, 12 / 48, [0.2, 0.2, 0.1]),
        run("grpo-async", 0, 20 / 48, [0.2, 0.3, 0.4], **{"async/staleness_mean": [0.0, 0.5, 0.5]}),
        run("grpo-async", 1, 22 / 48, [0.2, 0.3, 0.4]),
    ):
        (folder / f"{r['config']}-seed{r['seed']}.json").write_text(json.dumps(r))
    text = bench.report(a).read_text()
    assert text == (tmp_path / "results_arith3-short.md").read_text()
    assert "Untrained: **25.0%** (12/48)." in text
    # seeds 0 and 1 measured, seed 2 not: mean +- sample std over the two, pooled Wilson over 96
    assert "| `grpo-sync` | 50.0% | 37.5% | not measured | 43.8% ± 8.8% | +18.8% | 42/96 (" in text
    assert "| `ppo-sync` | 25.0% | not measured | not measured | 25.0% (1 seed) | +0.0% |" in text
    assert "| `grpo-async-tis` |" not in text  # neither asked for nor run
    assert "| `grpo-sync` | 0 | 50.0% | 0.20 0.40 0.50 | - | - | 3 1 0 | - | 10.0 min | 3.0 |" in text
    assert "| `grpo-async` | 0 | 41.7% | 0.20 0.30 0.40 | 0.33 |" in text
    assert "| `grpo-sync` | 2 | not measured |" in text
    # async - sync over seeds 0 and 1: -8.3% and +8.3%, the t-interval holds 0
    assert "`grpo-async` - `grpo-sync` over seeds [0, 1] after 48 rollouts: +0.0%" in text
    assert "inside the noise (the interval holds 0)" in text
    assert (
        "`ppo-sync` - `grpo-sync` on seed 0 only, after 48 rollouts: -25.0%; one seed gives no spread" in text
    )
    assert (tmp_path / "curves_arith3-short.png").stat().st_size > 1000


def test_runs_of_different_lengths_are_compared_after_the_same_rollouts(tmp_path: Path) -> None:
    a = args(tmp_path)
    folder = tmp_path / "results" / "arith3-short"
    folder.mkdir(parents=True)
    (folder / "before.json").write_text(
        json.dumps({"before": {"success_rate": 12 / 48, "n": 48, "mean_reward": 0.25, "failed": 0}})
    )

    def curve(*scores: float) -> list[dict[str, Any]]:  # evaluated every 2 updates of 16 rollouts
        return [
            {"step": 2 * i, "rollouts": 32 * i, "train_wall_s": 60.0 * i, "heldout_success": x}
            for i, x in enumerate(scores)
        ]

    long = {**run("grpo-sync", 0, 30 / 48, [0.2, 0.3, 0.4, 0.5]), "heldout_curve": curve(0.25, 0.5, 30 / 48)}
    short = {**run("ppo-sync", 0, 18 / 48, [0.2, 0.3]), "heldout_curve": curve(0.25, 18 / 48)}
    # trl_side.py's run files have a held-out curve with train rewards and no step curves
    trl = {**run("trl-grpo", 0, 0.5, []), "steps": 4, "curve": curve(0.25, 0.5, 0.5)}
    trl["curve"][1]["train_reward"] = 0.4
    del trl["curves"]
    for r in (long, short, trl):
        (folder / f"{r['config']}-seed{r['seed']}.json").write_text(json.dumps(r))
    assert bench._paired_point(short, long) == (18 / 48, 0.5, 32)
    assert bench._train_rewards(trl) == [0.4]
    text = bench.report(a).read_text()
    # each cell says its run's length; the difference is taken where both stood after 32 rollouts
    assert "| `grpo-sync` | 62.5% (4 upd.) |" in text
    assert "| `ppo-sync` | 37.5% (2 upd.) |" in text
    assert "`ppo-sync` - `grpo-sync` on seed 0 only, after 32 rollouts: -12.5%" in text


def test_report_with_no_runs_says_nothing_is_measured(tmp_path: Path) -> None:
    text = bench.report(args(tmp_path)).read_text()
    assert "Untrained: not measured yet." in text
    assert "| `grpo-sync` | not measured | not measured | not measured | not measured | - | - |" in text
    assert "- `ppo-sync`: no seed measured for both: no comparison." in text


def test_base_rates_table_from_the_preset_files(tmp_path: Path) -> None:
    record = {
        "preset": "legs2",
        "command": "nice -n 15 python -m benchmarks.learning_rg base-rates --tasks legs2 --n 64",
        "max_tokens": 128,
        "eval_seed": 10_000,
        "result": {"success_rate": 8 / 64, "mean_reward": 0.125, "n": 64, "failed": 0},
        "replies": {"replies": 64, "mean_tokens": 101.4, "cut": 20, "example": "..."},
        "wall_s": 300.0,
        "load_avg": [4.0, 4.0, 4.0],
    }
    (tmp_path / "legs2-short.json").write_text(json.dumps(dict(record, prompt="short")))
    (tmp_path / "legs2-short-3shot.json").write_text(json.dumps(dict(record, prompt="short", shots=3)))
    bench.write_base_rates(tmp_path, tmp_path / "base_rates.md")
    text = (tmp_path / "base_rates.md").read_text()
    assert "    nice -n 15 python -m benchmarks.learning_rg base-rates --tasks legs2 --n 64" in text
    assert "| `legs2` | `leg_counting` `" in text and "` | short | 0 | 8/64" in text
    assert "` | short | 3 | 8/64" in text  # a record without shots is one with none
    assert "| 8/64 = 12.5% | 6.5%-22.8% | 101 | 20/64 | 0 | 128 | 5.0 min (load 4.0) |" in text


def test_cli_rejects_an_unknown_preset(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench.main(["grid", "--task", "nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_untrained_score_is_the_base_rates_first_tasks(tmp_path: Path) -> None:
    a = args(tmp_path)
    a.eval_size, a.max_tokens = 4, 48
    base = tmp_path / "results" / "base_rates"
    base.mkdir(parents=True)
    record = {"preset": "arith3", "max_tokens": 48, "eval_seed": 10_000, "prompt": "short"}
    record["per_task"] = {"0": 1.0, "1": 0.0, "2": None, "3": 1.0, "4": 1.0, "5": 1.0}
    (base / "arith3-short.json").write_text(json.dumps(record))
    before = bench.before_score(a)
    # the first 4 tasks: two successes, one failed rollout (counted, scored as a miss)
    assert before["before"] == {"mean_reward": 2 / 3, "success_rate": 0.5, "n": 4, "failed": 1}
    assert before["source"] == "results/base_rates/arith3-short.json"
    saved = json.loads((tmp_path / "results" / "arith3-short" / "before.json").read_text())
    assert saved["before"] == before["before"] and saved["prompt"] == "short"


def test_shots_name_the_grid_and_pick_their_own_base_rates(tmp_path: Path) -> None:
    a = args(tmp_path)
    a.eval_size, a.max_tokens, a.shots = 2, 16, 3
    assert bench.variant(a) == "short-3shot"
    base = tmp_path / "results" / "base_rates"
    base.mkdir(parents=True)
    record = {"preset": "arith3", "max_tokens": 16, "eval_seed": 10_000, "prompt": "short"}
    # the same preset without shots is another prompt: never taken as this grid's untrained score
    (base / "arith3-short.json").write_text(json.dumps(dict(record, per_task={"0": 0.0, "1": 0.0})))
    shot = dict(record, shots=3, per_task={"0": 1.0, "1": 0.0})
    (base / "arith3-short-3shot.json").write_text(json.dumps(shot))
    before = bench.before_score(a)
    assert before["before"]["success_rate"] == 0.5
    assert before["source"] == "results/base_rates/arith3-short-3shot.json"
    assert (tmp_path / "results" / "arith3-short-3shot" / "before.json").is_file()
    env = bench.make_env("arith3", 2, 10_000, 16, "short", shots=3)
    assert len(env.messages(env.tasks[0])) == 8 and env.timeout == bench.CLIENT_TIMEOUT_S
