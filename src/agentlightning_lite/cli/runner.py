"""``agl-lite runner``: run an agent for a remote trainer (claim rollouts, run them, stream the spans)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ._common import EXIT_USAGE, CLIError


def add_parser(sub: Any) -> None:
    runner = sub.add_parser(
        "runner",
        help="run an agent for a trainer elsewhere: claim its rollouts, run them, send the spans back",
        description=(
            "Connect to a trainer started with agl.Trainer(runners=agl.RemoteRunners(...)), claim rollouts "
            "from its queue, run AGENT on each (WORKERS at a time) with an LLM endpoint routed to that "
            "rollout, and stream the agent's spans, rewards and results back. AGENT is 'module:function' "
            "(imported with the current directory on sys.path), 'path/to/file.py:function', or the name of "
            "a benchmark package under benchmarks/. The runner waits for the trainer and reconnects on its "
            "own when the trainer restarts; Ctrl-C or SIGTERM stops it after the rollouts in flight."
        ),
    )
    runner.add_argument(
        "agent", metavar="AGENT", help="module:function, file.py:function, or a benchmark name"
    )
    runner.add_argument(
        "--server",
        default=os.environ.get("AGL_SERVER", "http://127.0.0.1:8765"),
        help="the trainer's URL (default: $AGL_SERVER, else http://127.0.0.1:8765)",
    )
    runner.add_argument(
        "--api-key",
        default=os.environ.get("AGL_API_KEY"),
        help="the trainer's key, sent as 'Authorization: Bearer KEY' (default: $AGL_API_KEY)",
    )
    runner.add_argument("--workers", type=int, default=1, help="rollouts run at once (threads; default 1)")
    runner.add_argument("--worker-id", default=None, help="this runner's name (default: host-pid)")
    runner.add_argument(
        "--max-rollouts", type=int, default=None, help="stop after this many rollouts (default: never)"
    )
    runner.add_argument(
        "--give-up-after",
        type=float,
        default=None,
        help="exit when the trainer stays unreachable this many seconds (default: wait for ever)",
    )
    runner.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def runner(args: argparse.Namespace) -> int:
    """Run ``agl-lite runner`` until Ctrl-C / SIGTERM (or ``--max-rollouts``)."""
    from ..remote.runner import Runner, load_agent

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.workers < 1:
        raise CLIError("--workers must be at least 1", EXIT_USAGE)
    spec = args.agent if ":" in args.agent else f"benchmarks.{args.agent}:agent"
    try:
        agent = load_agent(spec)
    except (ImportError, AttributeError, FileNotFoundError, ValueError) as exc:
        raise CLIError(f"cannot load the agent {args.agent!r}: {exc}", EXIT_USAGE) from None
    run = Runner(
        agent,
        args.server,
        api_key=args.api_key,
        workers=args.workers,
        worker_id=args.worker_id,
        max_rollouts=args.max_rollouts,
        give_up_after=args.give_up_after,
    )
    print(
        f"agl-lite: runner {run.worker_id} ({args.workers} workers) for {args.server}; Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    run.run()
    print(
        f"agl-lite: runner {run.worker_id}: {run.completed} rollouts run, {run.counted} counted",
        file=sys.stderr,
        flush=True,
    )
    return 0
