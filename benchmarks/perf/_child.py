"""What the side-by-side perf benchmarks share: one fresh process per variant, one results file pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

PREFIX = "RESULT "


def emit(result: dict[str, Any]) -> None:
    """In the child: hand ``result`` to the parent (one stdout line)."""
    print(PREFIX + json.dumps(result), flush=True)


def run_child(module: str, args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``python -m module *args`` in a fresh process and return what it :func:`emit`-ted."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, check=False, env=env
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith(PREFIX)), None)
    if line is None:
        raise SystemExit(f"{module} {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[len(PREFIX) :])


def write_results(out: Path, lines: list[str], results: dict[str, Any]) -> None:
    """The Markdown table to ``out``, the raw figures beside it (``.json``), the table to stdout."""
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))
