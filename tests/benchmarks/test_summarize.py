"""``python -m benchmarks.summarize``: seeds pooled, paired tests on the same tasks, set-ups checked."""

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

from benchmarks import summarize  # noqa: E402


def test_doctests() -> None:
    assert doctest.testmod(summarize).failed == 0


def test_sign_test_is_exact_and_ignores_ties_and_missing() -> None:
    assert summarize.sign_test([0, 0, 1, None], [1, 0, 1, 1]) == (1, 0, 1.0)
    up, down, p = summarize.sign_test([0] * 10, [1] * 10)
    assert (up, down) == (10, 0) and p == pytest.approx(2 / 2**10)
    assert summarize.sign_test([1, 0], [0, 1])[2] == 1.0


def run(seed: int, warm: list[float], after: list[float], command: str = "") -> dict[str, Any]:
    def res(xs: list[float]) -> dict[str, Any]:
        return {"success_rate": sum(xs) / len(xs), "mean_reward": sum(xs) / len(xs), "per_task": xs}

    return {
        "seed": seed,
        "test_size": len(warm),
        "model": "m",
        "hardware": "h",
        "notes": "n",
        "steps": 1,
        "batch_size": 1,
        "group_size": 2,
        "sft": {"tasks": 4, "calls": 8, "s": 1.0},
        "rl_s": 1.0,
        "wall_s": 60.0,
        "command": command
        or f"python -m benchmarks.calc_x --steps 1 --seed {seed} --output-dir runs/s{seed}",
        "before": res([0.0] * len(warm)),
        "warm": res(warm),
        "after": res(after),
        "curve": None,
    }


def test_summary_pools_seeds_with_paired_tests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summarize, "ROOT", tmp_path)
    folder = tmp_path / "calc_x" / "results"
    folder.mkdir(parents=True)
    n = 12
    for seed in (0, 1):
        warm = [1.0] * 8 + [0.0] * (n - 8)
        (folder / f"results_sft_seed{seed}.json").write_text(json.dumps([run(seed, warm, warm)]))
    text = summarize.summarize("calc_x", "success_rate")
    assert (folder / "summary.md").read_text() == text
    # 8 of 12 tasks gained in each seed, none lost: exact two-sided p = 2 / 2**8
    # pooled over both seeds' pairs: 16 gained, none lost, p = 2 / 2**16
    assert (
        "| before -> warm start | 8/0 (p=0.00781); 8/0 (p=0.00781) | 16/0 (p=3.05e-05) | 8/0 (p=0.00781) |"
        in text
    )
    assert "| warm start -> warm start + GRPO | 0/0 (p=1); 0/0 (p=1) | 0/0 (p=1) | 0/0 (p=1) |" in text
    assert "0.667 ± 0.000 (seeds: 0.667, 0.667; pooled 16/24" in text

    other = run(2, [0.0] * n, [0.0] * n, command="python -m benchmarks.calc_x --steps 9 --seed 2")
    (folder / "results_sft_seed2.json").write_text(json.dumps([other]))
    with pytest.raises(SystemExit, match="different set-ups"):
        summarize.summarize("calc_x", "success_rate")
    assert "AIR off" not in text  # no seed ran that arm: no empty columns


def test_a_tagged_variant_is_summarised_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(summarize, "ROOT", tmp_path)
    folder = tmp_path / "calc_x" / "results"
    folder.mkdir(parents=True)
    base = run(0, [1.0] * 2 + [0.0] * 6, [1.0] * 2 + [0.0] * 6)
    (folder / "results_sft_seed0.json").write_text(json.dumps([base]))
    variant = run(
        0, [1.0] * 2 + [0.0] * 6, [1.0] * 7 + [0.0], command="python -m benchmarks.calc_x --steps 8"
    )
    off = dict(variant, after=variant["warm"])
    (folder / "results_english_sft_seed0.json").write_text(json.dumps([variant, off]))
    text = summarize.summarize("calc_x", "success_rate", tag="english")
    assert (folder / "summary_english.md").read_text() == text and not (folder / "summary.md").exists()
    assert "| warm start -> warm start + GRPO | 5/0 (p=0.0625) | 5/0 (p=0.0625) | 5/0 (p=0.0625) |" in text
    assert "0.875 (one seed" in text and "AIR off" in text  # the variant's own ablation arm
    assert "0.250 (one seed" in summarize.summarize("calc_x", "success_rate")  # the default set-up's file
    # an AIR-off arm run as a process of its own (--no-air): compared with its own warm start
    own = run(
        0, [1.0] * 3 + [0.0] * 5, [1.0] * 4 + [0.0] * 4, command="python -m benchmarks.calc_x --steps 8"
    )
    (folder / "results_english_sft_seed0.json").write_text(json.dumps([variant]))
    (folder / "results_english_sft_seed0_air_off.json").write_text(json.dumps([own]))
    text = summarize.summarize("calc_x", "success_rate", tag="english")
    assert "own warm starts scored success_rate 0.375" in text
    assert "| warm start -> + GRPO, AIR off | 1/0 (p=1) |" in text
    with pytest.raises(SystemExit, match=r"no results_other_sft_seed\*\.json"):
        summarize.summarize("calc_x", "success_rate", tag="other")


def test_results_tag_names_the_files_and_is_checked_at_parse_time() -> None:
    from benchmarks import _harness

    res = {"sft": {"tasks": 4}, "seed": 2, "air": True}
    assert _harness._tag(res) == "_sft_seed2"
    assert _harness._tag(dict(res, results_tag="english", air=False)) == "_english_sft_seed2_air_off"
    assert _harness._tag({"sft": None, "seed": 0, "results_tag": "x"}) == ""  # a plain run: one results.json
    assert _harness._results_tag("rl-easy_2") == "rl-easy_2"
    with pytest.raises(Exception, match="letters, digits"):
        _harness._results_tag("../x")
