"""The ``agl-lite`` command line: serve a policy, train an agent, and read a store of runs.

``agl-lite serve`` serves the policy model; ``agl-lite train`` runs ``Trainer.fit`` on an agent
given as ``module:function``; ``agl-lite apo`` optimises the prompts it reads (``agl.APO``);
``agl-lite runner`` runs an agent for a trainer elsewhere; ``runs``, ``show``, ``transitions``,
``export-sft`` and ``plot`` read an existing SQLite store without ever creating or changing it;
``doctor`` says why a training run's reward is flat, from its output directory's metrics;
``tinker`` serves the Tinker training API (the ``tinker`` SDK trains LoRA adapters on the model);
``recover`` marks the rollouts that a dead process left ``running`` as ``failed`` (error
``"interrupted"``).

>>> parser = build_parser()
>>> args = parser.parse_args(["serve", "--model", "smollm2-135m", "--port", "0"])
>>> args.command, args.model, args.port, args.host
('serve', 'smollm2-135m', 0, '127.0.0.1')
>>> args = parser.parse_args(["transitions", "runs.db", "--credit", "discounted:0.9"])
>>> args.credit
Discounted(gamma=0.9)
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
from collections.abc import Sequence

from ..store.readonly import StoreNotFound
from ..store.sqlite import NotOurDatabase
from . import apo, doctor, export, plot, recover, runner, runs, serve, tinker, train, transitions, ui
from ._common import (
    EXIT_CODES_HELP,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_RUNTIME,
    EXIT_USAGE,
    CLIError,
    parse_credit,
    print_error,
)
from .readstore import ReadOnlyStore
from .train import load_agent, load_tasks, prepare_tasks

CLIError.__module__ = __name__  # its public home: agentlightning_lite.cli.CLIError

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "CLIError",
    "ReadOnlyStore",
    "build_parser",
    "load_agent",
    "load_tasks",
    "parse_credit",
    "prepare_tasks",
    "main",
]


# -- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``agl-lite``."""
    parser = argparse.ArgumentParser(
        prog="agl-lite",
        description="agentlightning-lite: turn LLM agent runs into RL training data, and train on it.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    serve.add_parser(sub)
    train.add_parser(sub)
    apo.add_parser(sub)
    runner.add_parser(sub)
    runs.add_parsers(sub)
    transitions.add_parsers(sub)
    plot.add_parser(sub)
    doctor.add_parser(sub)
    recover.add_parser(sub)
    ui.add_parser(sub)
    export.add_parser(sub)
    tinker.add_parser(sub)
    return parser


_COMMANDS = {
    "serve": serve.serve,
    "train": train.train,
    "apo": apo.apo,
    "runner": runner.runner,
    "runs": runs.runs,
    "show": runs.show,
    "transitions": transitions.transitions_cmd,
    "export-sft": transitions.export_sft_cmd,
    "plot": plot.plot,
    "doctor": doctor.doctor,
    "recover": recover.recover,
    "ui": ui.ui,
    "export": export.export,
    "tinker": tinker.tinker,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agl-lite`` command; returns the exit code (see ``agl-lite --help``)."""
    for stream in (sys.stdout, sys.stderr):  # undecodable arguments or stored text never crash a print
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(argv)  # usage errors exit with 2
    command = _COMMANDS.get(args.command)
    if command is None:  # pragma: no cover - argparse rejects unknown commands
        parser.error(f"unknown command {args.command!r}")
    try:
        return command(args)
    except KeyboardInterrupt:
        return 130
    except CLIError as exc:
        print_error(f"error: {exc}")
        return exc.code
    except StoreNotFound as exc:
        print_error(f"error: {exc}")
        return EXIT_USAGE
    except NotOurDatabase as exc:
        print_error(f"error: {exc}")
        return EXIT_USAGE
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            print_error(f"error: {getattr(args, 'db', 'the store')} is locked by another process: {exc}")
            return EXIT_RUNTIME
        print_error(f"error: {getattr(args, 'db', 'the store')} is damaged or truncated ({exc})")
        return EXIT_USAGE
    except BrokenPipeError:  # `agl-lite runs db | head`
        return EXIT_OK
    except Exception as exc:
        print_error(
            f"error: {type(exc).__name__}: {exc}"
            if not isinstance(exc, (OSError, ValueError))
            else f"error: {exc}"
        )
        return EXIT_RUNTIME
