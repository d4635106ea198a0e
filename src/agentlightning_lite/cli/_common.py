"""What the ``agl-lite`` commands share: exit codes, errors, output and formatting helpers."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from .. import credit as _credit

EXIT_OK = 0  #: success

EXIT_RUNTIME = 1  #: the command ran and failed (training error, model load error, ...)

EXIT_USAGE = 2  #: bad arguments, a missing file, a file that is not an agentlightning-lite store

EXIT_NOT_FOUND = 3  #: the command ran, but found nothing (no rollouts, no transitions, no rewards)


EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  runtime error (the command ran and failed: training, model loading, ...)
  2  usage error: bad arguments, a missing file, or a file that is not an agentlightning-lite store
  3  nothing found: no rollouts / transitions / rewards match (or no rollout has that id)

Read-only commands (runs, show, transitions, export-sft, plot, ui, doctor) open the store read-only:
they never create, lock for writing or change the database file.

"""


class CLIError(Exception):
    """An error the CLI reports in one line, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.code = code


# -- output: rich when installed, plain text otherwise ----------------------------------------------
class Out:
    """Tables, trees and lines on stdout; ``rich`` when it is installed and not turned off."""

    def __init__(self, plain: bool = False) -> None:
        self.console: Any = None
        if not plain and not os.environ.get("AGL_PLAIN"):
            try:
                from rich.console import Console

                # piped or captured output is not cut to 80 columns: a table row stays one line
                width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 200)
                self.console = Console(highlight=False, soft_wrap=False, width=width)
            except ImportError:
                self.console = None

    @property
    def rich(self) -> bool:
        return self.console is not None

    def line(self, text: str = "", style: str | None = None) -> None:
        if self.console is not None:
            self.console.print(text, style=style, markup=False, highlight=False)
        else:
            print(text)

    def table(self, title: str | None, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        if self.console is not None:
            from rich.table import Table

            t = Table(title=title, title_justify="left", header_style="bold")
            for c in columns:
                numeric = c in {"reward", "final", "duration", "spans", "llm", "#", "tokens", "credited"}
                t.add_column(c, justify="right" if numeric else "left", overflow="fold")
            for r in rows:
                t.add_row(*[_escape_markup(x) for x in r])
            self.console.print(t)
            return
        if title:
            print(title)
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(columns)]
        print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
        print("  ".join("-" * w for w in widths))
        for r in rows:
            print("  ".join(x.ljust(w) for x, w in zip(r, widths, strict=True)).rstrip())

    def tree(self, root: str, children: list[tuple[str, list[Any]]]) -> None:
        """``children`` is a list of ``(label, grandchildren)`` pairs, recursively."""
        if self.console is not None:
            from rich.text import Text
            from rich.tree import Tree

            def add(node: Any, items: list[tuple[str, list[Any]]]) -> None:
                for label, sub in items:
                    add(node.add(Text(label, style="red" if " ERROR " in label else "")), sub)

            t = Tree(_escape_markup(root), guide_style="dim")
            add(t, children)
            self.console.print(t)
            return
        print(root)

        def walk(items: list[tuple[str, list[Any]]], prefix: str) -> None:
            for i, (label, sub) in enumerate(items):
                last = i == len(items) - 1
                print(f"{prefix}{'└── ' if last else '├── '}{label}")
                walk(sub, prefix + ("    " if last else "│   "))

        walk(children, "")


def _escape_markup(text: str) -> str:
    from rich.markup import escape

    return escape(text)


def print_error(message: str) -> None:
    """``agl-lite: message`` on stderr."""
    print(f"agl-lite: {message}", file=sys.stderr, flush=True)


# -- formatting -------------------------------------------------------------------------------------
def fmt_num(x: float | None) -> str:
    """A reward as a short number, ``-`` when there is none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}"


def fmt_dur(seconds: float | None) -> str:
    """``12 ms``, ``3.40 s``, ``2m05s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 0.01:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def preview(value: Any, width: int = 60) -> str:
    """One line of at most ``width`` characters saying what ``value`` is."""
    if value is None:
        return ""
    if isinstance(value, dict) and value.get("role") == "assistant":
        calls = value.get("tool_calls") or []
        names = [((c.get("function") or {}).get("name") or c.get("name") or "?") for c in calls]
        text = str(value.get("content") or "")
        if names:
            text = (text + " " if text else "") + "tool calls: " + ", ".join(names)
        value = text
    elif isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        value = f"{len(value)} messages, last {value[-1].get('role')}: {value[-1].get('content')}"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


# -- argument types ---------------------------------------------------------------------------------
def parse_credit(text: str) -> Any:
    """``final`` or ``discounted[:gamma]`` as a credit rule.

    >>> parse_credit("final"), parse_credit("discounted"), parse_credit("discounted:0.5")
    (FinalReward(add_intermediate=False), Discounted(gamma=1.0), Discounted(gamma=0.5))
    """
    name, _, gamma = text.partition(":")
    name = name.strip().lower()
    if name == "final" and not gamma:
        return _credit.FinalReward()
    if name == "discounted":
        try:
            return _credit.Discounted(float(gamma) if gamma else 1.0)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"bad discount in {text!r}: {exc}") from None
    raise argparse.ArgumentTypeError(f"credit must be 'final' or 'discounted[:gamma]', got {text!r}")


def name_list(values: Sequence[str] | None) -> list[str] | None:
    """``--agents a b`` or ``--agents a,b``."""
    if not values:
        return None
    return [n for v in values for n in v.split(",") if n]


def air_rules(args: argparse.Namespace) -> list[Any] | None:
    """The AIR rules of ``--tool-success``/``--tool-error`` (``None`` without them)."""
    if args.tool_success is None and args.tool_error is None:
        return None
    from ..air import ToolStatus

    return [ToolStatus(success=args.tool_success or 0.0, error=args.tool_error or 0.0)]


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for ``--json`` output: NaN as null, anything else as text."""
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def collect_warnings(fn: Any) -> Any:
    """``fn()``, its warnings printed as ``agl-lite: warning: ...`` lines on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    for w in caught:
        print_error(f"warning: {w.message}")
    return result


def reader_parser(sub: Any, name: str, help: str, description: str) -> argparse.ArgumentParser:
    """A sub-command that reads the store DB (its first argument) read-only."""
    p = sub.add_parser(
        name,
        help=help,
        description=description,
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("db", metavar="DB", help="an agentlightning-lite SQLite store (opened read-only)")
    return p


def add_parser_flags(parser: argparse.ArgumentParser) -> None:
    """``--tool-call-parser`` and ``--reasoning-parser``, by vLLM's names (``serve`` and ``train``)."""
    parser.add_argument(
        "--tool-call-parser",
        default="auto",
        metavar="NAME",
        help="how the model writes tool calls, by vLLM's names: hermes, qwen3_coder, llama3_json, pythonic, "
        "mistral, deepseek_v31, glm45, kimi_k2, openai; 'auto' reads it from the chat template "
        "(default: auto; docs/models.md)",
    )
    parser.add_argument(
        "--reasoning-parser",
        default="auto",
        metavar="NAME",
        help="how the model writes its thinking, by vLLM's names: qwen3, deepseek_r1, mistral, "
        "openai_gptoss; 'none': no reasoning; 'auto' reads it from the chat template (default: auto)",
    )


def parser_options(args: argparse.Namespace) -> dict[str, Any]:
    """The PolicyServer's ``tool_parser``/``reasoning_parser`` from the flags; an unknown name is a usage
    error, raised before any model loads.

    >>> ns = argparse.Namespace(tool_call_parser="qwen3_coder", reasoning_parser="none")
    >>> parser_options(ns)
    {'tool_parser': 'qwen3_coder', 'reasoning_parser': None}
    >>> try:
    ...     parser_options(argparse.Namespace(tool_call_parser="qwen4", reasoning_parser="auto"))
    ... except CLIError as exc:
    ...     print(str(exc)[:50], exc.code)
    --tool-call-parser 'qwen4': one of auto, deepseek_ 2
    """
    from ..serving.parsers import REASONING_PARSERS, TOOL_PARSERS

    for flag, name, table in (
        ("--tool-call-parser", args.tool_call_parser, TOOL_PARSERS),
        ("--reasoning-parser", args.reasoning_parser, {**REASONING_PARSERS, "none": None}),
    ):
        if name != "auto" and name not in table:
            raise CLIError(f"{flag} {name!r}: one of auto, {', '.join(sorted(table))}", EXIT_USAGE)
    reasoning = None if args.reasoning_parser == "none" else args.reasoning_parser
    return {"tool_parser": args.tool_call_parser, "reasoning_parser": reasoning}
