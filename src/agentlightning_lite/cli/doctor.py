"""``agl-lite doctor``: why a training run's reward is flat, read from what the run recorded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..rl.doctor_report import diagnose_run, format_text, to_json
from ._common import EXIT_CODES_HELP, EXIT_OK, EXIT_USAGE, CLIError


def add_parser(sub: Any) -> None:
    """The ``doctor`` sub-command."""
    p = sub.add_parser(
        "doctor",
        help="say why a training run's reward is flat, from its metrics",
        description=(
            "Read RUN_DIR/metrics.jsonl (a Trainer's output_dir), and runs.db next to it for the errors "
            "of failed rollouts, and list what explains a flat reward: groups without reward spread, "
            "replies cut at max_tokens, unparsed tool calls, a constant reward, failed rollouts, entropy "
            "collapse, engine/trainer mismatch, a learning rate too high, a falling reward; each with "
            "its figure, its steps and what to try. Exits 0 whatever it finds; reads, never writes."
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "run_dir", metavar="RUN_DIR", help="a training run's output directory (or its metrics.jsonl)"
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON object on stdout")


def doctor(args: argparse.Namespace) -> int:
    """``agl-lite doctor RUN_DIR``: the run's findings; exit 0 (also with findings), 2 without metrics."""
    run = Path(args.run_dir)
    metrics = run / "metrics.jsonl" if run.is_dir() else run
    if not metrics.is_file():
        where = "no such directory" if not run.exists() else "no metrics.jsonl in it"
        raise CLIError(
            f"{args.run_dir}: {where} (give the output_dir of a training run, where Trainer.fit writes "
            "metrics.jsonl)",
            EXIT_USAGE,
        )
    report = diagnose_run(run)
    print(to_json(report) if args.json else format_text(report))
    return EXIT_OK
