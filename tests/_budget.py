"""The suite's own time keeping: every test's duration on each run, and a wall-time budget that fails it.

Registered by ``tests/conftest.py`` (any pytest run of this repository loads it):

* each run writes ``durations.tsv`` (every test, slowest first: seconds of setup + call + teardown, the
  outcome, the node id) and ``summary.json`` (wall time, counts, the budget) into ``$AGL_TEST_REPORT_DIR``
  (default ``.test-results/`` at the repository root), so the next slow test is found with
  ``head .test-results/durations.tsv``, not by reading tests;
* with ``$AGL_TEST_BUDGET_S`` set (``.ci/run`` sets it), a run whose wall time passes the budget fails
  (exit status 1) and names its slowest tests, even when every test passed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: how many of the slowest tests a budget failure names
NAMED = 15


def report_dir() -> Path:
    return Path(os.environ.get("AGL_TEST_REPORT_DIR") or ROOT / ".test-results")


def budget_s() -> float | None:
    raw = os.environ.get("AGL_TEST_BUDGET_S", "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise pytest.UsageError(f"AGL_TEST_BUDGET_S must be a number of seconds, got {raw!r}") from None
    return value if value > 0 else None


class Budget:
    """The pytest plugin: sums each test's phases, writes the files, enforces the budget."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.tests: dict[str, dict[str, Any]] = {}
        self.budget = budget_s()
        self.over: float | None = None
        self.write_error: str | None = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.tests.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
        row["seconds"] += report.duration
        if report.failed:
            row["outcome"] = "failed" if report.when == "call" else "error"
        elif report.skipped and row["outcome"] == "passed":
            row["outcome"] = "skipped"

    def slowest(self) -> list[tuple[str, dict[str, Any]]]:
        return sorted(self.tests.items(), key=lambda kv: -kv[1]["seconds"])

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        wall = time.monotonic() - self.start
        if getattr(session.config, "workerinput", None) is not None:
            return  # a pytest-xdist worker: the controller writes the files
        if self.budget is not None and wall > self.budget and self.tests:
            self.over = wall
            if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
        out = report_dir()
        try:
            out.mkdir(parents=True, exist_ok=True)
            lines = ["seconds\toutcome\ttest"]
            lines += [f"{r['seconds']:.2f}\t{r['outcome']}\t{node}" for node, r in self.slowest()]
            (out / "durations.tsv").write_text("\n".join(lines) + "\n")
            counts: dict[str, int] = {}
            for r in self.tests.values():
                counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
            summary = {"wall_s": round(wall, 1), "tests": len(self.tests), "outcomes": counts}
            summary |= {"budget_s": self.budget, "args": session.config.invocation_params.args}
            (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
        except OSError as exc:  # a read-only checkout: the run itself is not failed for it
            self.write_error = f"could not write the durations into {out}: {exc}"

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.write_error:
            terminalreporter.write_line(self.write_error)
        if self.over is None:
            return
        tr = terminalreporter
        tr.section("test budget", sep="=", red=True, bold=True)
        tr.write_line(
            f"the suite took {self.over:.0f} s, over its budget of {self.budget:.0f} s "
            f"($AGL_TEST_BUDGET_S); its {NAMED} slowest tests:",
            red=True,
        )
        for node, r in self.slowest()[:NAMED]:
            tr.write_line(f"  {r['seconds']:8.1f} s  {node}")
        tr.write_line(f"every test's time: {report_dir() / 'durations.tsv'}")


def pytest_configure(config: pytest.Config) -> None:
    """Register the plugin once (``tests/conftest.py`` calls this; ``-p _budget`` loads it alone)."""
    if not config.pluginmanager.has_plugin("agl-budget"):
        config.pluginmanager.register(Budget(), "agl-budget")
