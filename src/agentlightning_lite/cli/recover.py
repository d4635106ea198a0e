"""``agl-lite recover``: mark rollouts left ``running`` by a process that died ``failed`` ("interrupted")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ..store.recovery import INTERRUPTED, recover_interrupted, stale_running
from ..store.sqlite import SQLiteStore
from ._common import EXIT_CODES_HELP, EXIT_OK, EXIT_USAGE, CLIError, Out, fmt_time
from .readstore import ReadOnlyStore


def add_parser(sub: Any) -> None:
    """The ``recover`` sub-command."""
    p = sub.add_parser(
        "recover",
        help="mark rollouts whose process died failed (error 'interrupted')",
        description=(
            "Mark the rollouts that a dead process left 'running' as 'failed' with error "
            f"'{INTERRUPTED}'. A rollout records the pid and host of the process that started it: "
            "one started on this host whose process no longer exists is marked. Rollouts started on "
            "another host (or by a version that recorded no owner) are marked only with --older-than. "
            "Opens DB for writing (it must exist); live processes may keep writing to it meanwhile."
        ),
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("db", metavar="DB", help="an agentlightning-lite SQLite store (opened for writing)")
    p.add_argument(
        "--older-than",
        type=float,
        default=None,
        metavar="SECONDS",
        help="also mark running rollouts whose process cannot be checked from here, when started "
        "more than SECONDS ago",
    )
    p.add_argument("--dry-run", action="store_true", help="list what would be marked; change nothing")
    p.add_argument("--json", action="store_true", help="a JSON list of the rollouts marked on stdout")
    p.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")


def recover(args: argparse.Namespace) -> int:
    """``agl-lite recover DB``: mark interrupted rollouts failed; exit 0 (also when none were found)."""
    if args.older_than is not None and not args.older_than >= 0:
        raise CLIError(f"--older-than must be a number of seconds >= 0, got {args.older_than}", EXIT_USAGE)
    path = Path(args.db)
    if args.dry_run:
        reader = ReadOnlyStore(path)  # also checks that DB exists and is ours
        try:
            marked = stale_running(reader.rollouts(status="running"), args.older_than)
        finally:
            reader.close()
    else:
        ReadOnlyStore(path).close()  # exists and is ours: never create a file by accident
        store = SQLiteStore(path)
        try:
            marked = recover_interrupted(store, args.older_than)
        finally:
            store.close()
    if args.json:
        print(
            json.dumps(
                [{"rollout_id": r.rollout_id, "mode": r.mode, "start_time": r.start_time} for r in marked]
            )
        )
        return EXIT_OK
    o = Out(args.plain)
    verb = "would mark" if args.dry_run else "marked"
    if not marked:
        o.line(f"{args.db}: no interrupted rollouts")
        return EXIT_OK
    o.line(f"{args.db}: {verb} {len(marked)} rollout(s) failed ({INTERRUPTED})")
    for r in marked:
        o.line(f"  {r.rollout_id}  {r.mode}  started {fmt_time(r.start_time)}")
    return EXIT_OK
