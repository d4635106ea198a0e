"""The suite's time keeping (tests/_budget.py), run on a suite of two tests in a pytest of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]

SUITE = """
import time

def test_slow():
    time.sleep(0.3)

def test_quick():
    pass
"""


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "suite").mkdir(exist_ok=True)
    (tmp_path / "suite" / "test_two.py").write_text(SUITE)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("AGL_TEST_")}
    environ |= {"PYTHONPATH": str(TESTS), "AGL_TEST_REPORT_DIR": str(tmp_path / "report"), **env}
    cmd = [sys.executable, "-m", "pytest", "-p", "_budget", "-p", "no:cacheprovider", "-q"]
    cmd += ["--rootdir", str(tmp_path / "suite"), str(tmp_path / "suite")]
    return subprocess.run(cmd, env=environ, capture_output=True, text=True, timeout=120, cwd=tmp_path)


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_every_run_writes_each_tests_duration_slowest_first(tmp_path: Path) -> None:
    proc = _pytest(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = (tmp_path / "report" / "durations.tsv").read_text().splitlines()
    assert rows[0] == "seconds\toutcome\ttest"
    seconds, outcome, node = rows[1].split("\t")
    assert node.endswith("test_two.py::test_slow") and outcome == "passed" and float(seconds) >= 0.3
    assert rows[2].split("\t")[2].endswith("test_two.py::test_quick") and len(rows) == 3
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert summary["tests"] == 2 and summary["outcomes"] == {"passed": 2} and summary["budget_s"] is None
    assert summary["wall_s"] >= 0.3
    assert "budget" not in proc.stdout


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_run_over_its_budget_fails_and_names_its_slowest_tests(tmp_path: Path) -> None:
    proc = _pytest(tmp_path, AGL_TEST_BUDGET_S="0.2")
    assert proc.returncode == 1, proc.stdout + proc.stderr  # every test passed: the budget failed it
    assert "2 passed" in proc.stdout
    assert "over its budget of 0 s ($AGL_TEST_BUDGET_S)" in proc.stdout
    named = proc.stdout.split("slowest tests:")[1].splitlines()[1:3]
    assert named[0].endswith("test_two.py::test_slow") and named[1].endswith("test_two.py::test_quick")
    assert str(tmp_path / "report" / "durations.tsv") in proc.stdout
    assert json.loads((tmp_path / "report" / "summary.json").read_text())["budget_s"] == 0.2


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_run_within_its_budget_passes_and_a_bad_budget_is_a_usage_error(tmp_path: Path) -> None:
    within = _pytest(tmp_path, AGL_TEST_BUDGET_S="600")
    assert within.returncode == 0 and "budget" not in within.stdout, within.stdout
    bad = _pytest(tmp_path, AGL_TEST_BUDGET_S="half an hour")
    assert bad.returncode == 4 and "AGL_TEST_BUDGET_S must be a number of seconds" in bad.stderr
