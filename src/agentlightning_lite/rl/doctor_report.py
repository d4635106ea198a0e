"""A run's diagnosis from its output directory: ``metrics.jsonl`` (a cut last line is counted, not fatal)
and, when ``runs.db`` is next to it, the errors of its failed training rollouts; as plain text or JSON
(what ``agl-lite doctor RUN_DIR`` prints). The findings are :func:`~.doctor.diagnose`'s.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .doctor import Finding, Thresholds, diagnose

__all__ = ["Report", "diagnose_run", "format_text", "read_metrics", "to_json"]


@dataclass(frozen=True)
class Report:
    """What :func:`diagnose_run` found in a run: its ``findings``, how many metric ``rows`` it read,
    how many lines it could not read (``bad_lines``: a run killed while writing leaves a cut last
    line) and the most common ``errors`` of the failed training rollouts (from ``runs.db``).

    >>> Report("runs/x", (), rows=0).warnings
    []
    """

    path: str
    findings: tuple[Finding, ...]
    rows: int
    bad_lines: int = 0
    errors: tuple[tuple[str, int], ...] = field(default=())

    @property
    def warnings(self) -> list[Finding]:
        """The findings of severity ``"warning"``."""
        return [f for f in self.findings if f.severity == "warning"]


def read_metrics(path: str | Path) -> tuple[list[dict[str, Any]], int]:
    """The rows of a ``metrics.jsonl`` and the number of lines that are not JSON objects (a cut last line).

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "metrics.jsonl")
    >>> _ = open(p, "w").write('{"step": 1}\\n{"step": 2, "train/lo')
    >>> read_metrics(p)
    ([{'step': 1}], 1)
    """
    rows, bad = [], 0
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(row, dict):
            rows.append(row)
        else:
            bad += 1
    return rows, bad


def _errors(db: Path, limit: int = 3) -> tuple[tuple[str, int], ...]:
    """The most common errors of the failed training rollouts of the store ``db`` (none when unreadable)."""
    from ..store.readonly import ReadOnlyStore

    try:
        store = ReadOnlyStore(db)
        try:
            failed = store.rollouts(mode="train", status="failed")
        finally:
            store.close()
    except Exception:  # not a store, locked, damaged: the metrics still tell the rest
        return ()
    counts = Counter(" ".join((r.error or "no error recorded").split())[:200] for r in failed)
    return tuple(counts.most_common(limit))


def diagnose_run(run_dir: str | Path, *, thresholds: Thresholds | None = None) -> Report:
    """Diagnose the run in ``run_dir`` (its ``metrics.jsonl``, and ``runs.db`` for the failed rollouts'
    errors). Raises ``FileNotFoundError`` when there is no ``metrics.jsonl``.

    >>> import tempfile, json, os
    >>> run = tempfile.mkdtemp()
    >>> rows = [{"step": s, "train/reward_mean": 0.0, "grpo/zero_std_frac": 1.0} for s in range(1, 7)]
    >>> _ = open(os.path.join(run, "metrics.jsonl"), "w").write("\\n".join(map(json.dumps, rows)))
    >>> report = diagnose_run(run)
    >>> report.rows, [f.code for f in report.warnings]
    (6, ['zero_spread', 'constant_reward'])
    """
    directory = Path(run_dir)
    path = directory / "metrics.jsonl" if directory.is_dir() else directory
    if not path.is_file():
        raise FileNotFoundError(f"no metrics.jsonl in {run_dir}: not a training run's output directory")
    rows, bad = read_metrics(path)
    errors = _errors(path.parent / "runs.db") if (path.parent / "runs.db").is_file() else ()
    return Report(str(run_dir), tuple(diagnose(rows, thresholds=thresholds)), len(rows), bad, errors)


def format_text(report: Report) -> str:
    """The report as plain text: warnings first, then what is only worth knowing.

    >>> print(format_text(Report("runs/x", (), rows=12)))
    runs/x: 12 steps read
    no findings: nothing in the metrics explains a flat reward
    """
    lines = [f"{report.path}: {report.rows} steps read"]
    if report.bad_lines:
        lines.append(
            f"{report.bad_lines} line(s) of metrics.jsonl could not be read (a run killed while writing)"
        )
    warnings, infos = report.warnings, [f for f in report.findings if f.severity != "warning"]
    if not warnings:
        lines.append("no findings: nothing in the metrics explains a flat reward")
    for title, items in (("warnings", warnings), ("for information", infos)):
        if not items:
            continue
        lines.append(f"\n{title}:" if warnings else f"{title}:")
        for f in items:
            lines += [f"  [{f.code}] {f.message}", f"    figure: {f.figure}", f"    try: {f.advice}"]
            if f.code == "failed_rollouts" and report.errors:
                lines += [f"    error ({n}x): {e}" for e, n in report.errors]
    return "\n".join(lines)


def to_json(report: Report) -> str:
    """The report as JSON: ``path``, ``rows``, ``bad_lines``, ``errors``, ``findings``.

    >>> to_json(Report("runs/x", (), rows=3))
    '{"path": "runs/x", "rows": 3, "bad_lines": 0, "errors": [], "findings": []}'
    """
    return json.dumps(
        {
            "path": report.path,
            "rows": report.rows,
            "bad_lines": report.bad_lines,
            "errors": [{"error": e, "count": n} for e, n in report.errors],
            "findings": [f.to_dict() for f in report.findings],
        }
    )
