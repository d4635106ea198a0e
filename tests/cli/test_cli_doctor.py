"""``agl-lite doctor RUN_DIR``: a run's findings as text or JSON; exit 0 with findings, 2 without metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentlightning_lite.cli import EXIT_OK, EXIT_USAGE, main


def _run_dir(path: Path, **over: float) -> Path:
    """A run of 6 steps: rewards rising, a quarter of the groups without spread (unless ``over``)."""
    rows = [
        {"step": s, "train/reward_mean": 0.1 * s, "grpo/zero_std_frac": 0.25, "train/samples": 8.0,
         "samples/truncated": 0.0, **over}
        for s in range(1, 7)
    ]  # fmt: skip
    path.mkdir()
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_doctor_prints_each_finding_with_its_figure_and_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path / "flat", **{"grpo/zero_std_frac": 1.0, "samples/truncated": 4.0})
    assert main(["doctor", str(run)]) == EXIT_OK  # findings are no error
    out = capsys.readouterr().out
    assert out.startswith(f"{run}: 6 steps read\n\nwarnings:\n  [zero_spread] ")
    assert "    figure: 50% of calls cut at max_tokens (24 of 48), steps 1-6" in out
    assert "    try: larger groups (agl.GRPO(group_size=...)) or more tasks per step" in out
    assert main(["doctor", str(run / "metrics.jsonl")]) == EXIT_OK  # the file itself works too
    assert capsys.readouterr().out == out.replace(f"{run}:", f"{run / 'metrics.jsonl'}:", 1)


def test_doctor_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path / "flat", **{"grpo/zero_std_frac": 1.0})
    assert main(["doctor", str(run), "--json"]) == EXIT_OK
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 6 and report["bad_lines"] == 0
    [finding] = report["findings"]
    assert finding["code"] == "zero_spread" and finding["severity"] == "warning"
    assert finding["steps"] == [1, 2, 3, 4, 5, 6] and "group_size" in finding["advice"]


def test_doctor_on_a_healthy_run_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", str(_run_dir(tmp_path / "ok"))]) == EXIT_OK
    assert (
        capsys.readouterr().out.splitlines()[1]
        == "no findings: nothing in the metrics explains a flat reward"
    )


def test_doctor_without_metrics_exits_2_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"agl-lite: error: {tmp_path}: no metrics.jsonl in it") and "output_dir" in err
    assert main(["doctor", str(tmp_path / "nope")]) == EXIT_USAGE
    assert "no such directory" in capsys.readouterr().err
