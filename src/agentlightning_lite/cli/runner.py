"""``agl-lite runner``: run an agent for a remote trainer (claim rollouts, run them, stream the spans)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable
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
            "own when the trainer restarts; Ctrl-C or SIGTERM stops it after the rollouts in flight. "
            "Instead of AGENT, --command runs a program once per rollout (agl.CommandAgent: its own "
            "working directory, the rollout's endpoint in its environment, sandboxed to loopback and the "
            "trainer's port) and --harness runs Claude Code, Codex or opencode that way."
        ),
    )
    runner.add_argument(
        "agent",
        metavar="AGENT",
        nargs="?",
        help="module:function, file.py:function, or a benchmark name (or give --command / --harness)",
    )
    harness = runner.add_argument_group(
        "a program per rollout instead of AGENT (agl.CommandAgent; see docs/harnesses.md)"
    )
    harness.add_argument(
        "--command",
        dest="run_command",
        metavar="CMD",
        help="the program run once per rollout, split like a shell would ('{task}' is replaced by the "
        "task; the rollout's endpoint is in OPENAI_BASE_URL, ANTHROPIC_BASE_URL, ...)",
    )
    harness.add_argument(
        "--harness",
        choices=("opencode", "codex", "claude-code"),
        help="a recipe: the harness CLI with the config it needs written for each rollout",
    )
    harness.add_argument(
        "--executable", help="the harness CLI to run (default: its name on PATH); with --harness"
    )
    harness.add_argument(
        "--task-via", choices=("arg", "stdin", "file"), default=None, help="how the task reaches --command"
    )
    harness.add_argument("--timeout", type=float, default=600.0, help="seconds per run (default 600)")
    harness.add_argument(
        "--verifier", metavar="CMD", help="run in the working directory afterwards: its reward"
    )
    harness.add_argument("--template", metavar="DIR", help="each run's working directory starts as a copy")
    harness.add_argument(
        "--network",
        choices=("isolated", "host"),
        default="isolated",
        help="isolated (default): only loopback and the server's port; host: this machine's network",
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
    from ..remote.worker import Runner, load_agent

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if args.workers < 1:
        raise CLIError("--workers must be at least 1", EXIT_USAGE)
    agent = _agent_of(args, load_agent)
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


def _agent_of(args: argparse.Namespace, load_agent: Any) -> Any:
    """The agent the arguments name: AGENT, or a CommandAgent for --command / --harness."""
    given = [x for x in (args.agent, args.run_command, args.harness) if x]
    if len(given) != 1:
        raise CLIError("give exactly one of AGENT, --command and --harness", EXIT_USAGE)
    if args.agent:
        spec = args.agent if ":" in args.agent else f"benchmarks.{args.agent}:agent"
        try:
            return load_agent(spec)
        except (ImportError, AttributeError, FileNotFoundError, ValueError) as exc:
            raise CLIError(f"cannot load the agent {args.agent!r}: {exc}", EXIT_USAGE) from None
    from ..harness import CommandAgent, claude_code, codex, opencode

    common: dict[str, Any] = {
        "timeout": args.timeout,
        "verifier": args.verifier,
        "template": args.template,
        "network": args.network,
    }
    try:
        if args.run_command:
            return CommandAgent(args.run_command, task_via=args.task_via or "arg", **common)
        recipes: dict[str, Callable[..., CommandAgent]] = {
            "opencode": opencode,
            "codex": codex,
            "claude-code": claude_code,
        }
        recipe = recipes[args.harness]
        if args.executable:
            common["executable"] = args.executable
        if args.task_via:
            raise CLIError(
                "--task-via goes with --command (each --harness takes its task its own way)", EXIT_USAGE
            )
        return recipe(**common)
    except ValueError as exc:
        raise CLIError(str(exc), EXIT_USAGE) from None
