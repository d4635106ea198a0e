"""The ``agl-lite`` command line: serve a policy, train an agent, and read a store of runs.

``agl-lite serve`` serves the policy model; ``agl-lite train`` runs ``Trainer.fit`` on an agent
given as ``module:function``; ``runs``, ``show``, ``transitions``, ``export-sft`` and ``plot`` read
an existing SQLite store without ever creating or changing it.

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
import datetime as _dt
import importlib
import importlib.util
import json
import logging
import math
import os
import sqlite3
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from . import credit as _credit
from .store.base import Store
from .store.rows import row_to_span
from .store.sqlite import _ROLLOUT_COLUMNS, _SPAN_COLUMNS, APPLICATION_ID, NotOurDatabase, _row_rollout
from .types import Rollout, Span

__all__ = [
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_RUNTIME",
    "EXIT_USAGE",
    "CLIError",
    "ReadOnlyStore",
    "build_parser",
    "main",
]

EXIT_OK = 0  #: success
EXIT_RUNTIME = 1  #: the command ran and failed (training error, model load error, ...)
EXIT_USAGE = 2  #: bad arguments, a missing file, a file that is not an agentlightning-lite store
EXIT_NOT_FOUND = 3  #: the command ran, but found nothing (no rollouts, no transitions, no rewards)

_EXIT_CODES_HELP = """\
exit codes:
  0  success
  1  runtime error (the command ran and failed: training, model loading, ...)
  2  usage error: bad arguments, a missing file, or a file that is not an agentlightning-lite store
  3  nothing found: no rollouts / transitions / rewards match (or no rollout has that id)

Read-only commands (runs, show, transitions, export-sft, plot) open the store read-only:
they never create, lock for writing or change the database file.

"""


class CLIError(Exception):
    """An error the CLI reports in one line, with the exit code it means."""

    def __init__(self, message: str, code: int = EXIT_RUNTIME) -> None:
        super().__init__(message)
        self.code = code


# -- reading a store without touching it ------------------------------------------------------------
class ReadOnlyStore(Store):
    """An existing SQLite store opened read-only: reads work, writes raise, the file is never changed.

    Raises :class:`CLIError` (exit code 2) when ``path`` does not exist and
    :class:`~agentlightning_lite.store.sqlite.NotOurDatabase` when it is not an agentlightning-lite
    store. Unlike ``SQLiteStore(path)``, nothing is created: a file that is cleanly closed (no
    ``-wal`` file next to it) is opened ``immutable`` (no lock or side files); one that a live
    writer holds in WAL mode is opened ``mode=ro`` and sees what the writer has committed.

    >>> import os, tempfile, agentlightning_lite as agl
    >>> path = os.path.join(tempfile.mkdtemp(), "runs.db")
    >>> with agl.SQLiteStore(path) as store:
    ...     with agl.Tracer(store).rollout("2+2?") as ro:
    ...         ro.reward(1.0)
    >>> [r.reward for r in ReadOnlyStore(path).rollouts()]
    [1.0]
    >>> ReadOnlyStore(os.path.join(os.path.dirname(path), "missing.db"))
    Traceback (most recent call last):
    ...
    agentlightning_lite.cli.CLIError: no such file: .../missing.db
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise CLIError(f"no such file: {self.path}", EXIT_USAGE)
        if not self.path.is_file():
            raise CLIError(f"not a file: {self.path}", EXIT_USAGE)
        wal = self.path.with_name(self.path.name + "-wal")
        # immutable: no locks and no -shm/-wal files created; safe because no writer has it open
        flags = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
        uri = f"file:{quote(str(self.path.resolve()))}?{flags}"
        try:
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise NotOurDatabase(f"{self.path} is not a SQLite database ({exc})") from None
        if app_id != APPLICATION_ID:
            self._conn.close()
            raise NotOurDatabase(f"{self.path} is not an agentlightning-lite store")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, tuple(params)).fetchall()

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        rows = self._query(f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
        return _row_rollout(rows[0]) if rows else None

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        where, params = [], []
        for col, value in (("mode", mode), ("status", status)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        sql = f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        return [_row_rollout(r) for r in self._query(sql + " ORDER BY start_time, rowid", params)]

    def spans(self, rollout_id: str) -> list[Span]:
        rows = self._query(
            f"SELECT {_SPAN_COLUMNS} FROM spans WHERE rollout_id = ? ORDER BY start_time, seq", (rollout_id,)
        )
        return [row_to_span(r) for r in rows]

    def find_rollouts(self, prefix: str, limit: int = 6) -> list[str]:
        """Ids of rollouts whose id starts with ``prefix`` (an exact id first)."""
        if self._query("SELECT 1 FROM rollouts WHERE rollout_id = ?", (prefix,)):
            return [prefix]
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query(
            "SELECT rollout_id FROM rollouts WHERE rollout_id LIKE ? ESCAPE '\\' ORDER BY start_time LIMIT ?",
            (escaped + "%", limit),
        )
        return [r[0] for r in rows]

    def span_summary(self) -> dict[str, dict[str, Any]]:
        """Per rollout: number of spans, of policy LLM calls, and the agents' names (first seen first)."""
        out: dict[str, dict[str, Any]] = {}
        for rid, kind, agent, attrs in self._query(
            "SELECT rollout_id, kind, agent, attributes FROM spans ORDER BY start_time, seq"
        ):
            item = out.setdefault(rid, {"spans": 0, "llm_calls": 0, "agents": []})
            item["spans"] += 1
            if kind == "llm" and "agl.duplicate_of" not in attrs:  # a joined framework view counts once
                item["llm_calls"] += 1
            if agent and agent not in item["agents"]:
                item["agents"].append(agent)
        return out

    def add_spans(self, spans: Iterable[Span]) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def _insert_rollout(self, rollout: Rollout) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def _update_rollout(self, rollout: Rollout) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def close(self) -> None:
        self._conn.close()


# -- output: rich when installed, plain text otherwise ----------------------------------------------
class _Out:
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


def _err(message: str) -> None:
    print(f"agl-lite: {message}", file=sys.stderr, flush=True)


# -- formatting -------------------------------------------------------------------------------------
def _fmt_num(x: float | None) -> str:
    """A reward as a short number, ``-`` when there is none."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.4g}"


def _fmt_dur(seconds: float | None) -> str:
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


def _fmt_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


def _preview(value: Any, width: int = 60) -> str:
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


def _names(values: Sequence[str] | None) -> list[str] | None:
    """``--agents a b`` or ``--agents a,b``."""
    if not values:
        return None
    return [n for v in values for n in v.split(",") if n]


# -- the parser -------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``agl-lite``."""
    parser = argparse.ArgumentParser(
        prog="agl-lite",
        description="agentlightning-lite: turn LLM agent runs into RL training data, and train on it.",
        epilog=_EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_serve(sub)
    _add_train(sub)

    def reader(name: str, help: str, description: str) -> argparse.ArgumentParser:
        p = sub.add_parser(
            name,
            help=help,
            description=description,
            epilog=_EXIT_CODES_HELP,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        p.add_argument("db", metavar="DB", help="an agentlightning-lite SQLite store (opened read-only)")
        return p

    runs = reader("runs", "list the rollouts of a store", "List rollouts: status, reward, duration, agents.")
    runs.add_argument("--mode", choices=("train", "val", "trace"), help="only rollouts of this mode")
    runs.add_argument(
        "--status", choices=("running", "succeeded", "failed", "timeout"), help="only this status"
    )
    runs.add_argument("--limit", type=int, default=50, help="show the newest N (default 50; 0 = all)")
    runs.add_argument("--json", action="store_true", help="a JSON list on stdout")
    runs.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")

    show = reader(
        "show", "show one rollout's span tree", "The span tree of one rollout: timings, tools, rewards."
    )
    show.add_argument("rollout_id", metavar="ROLLOUT_ID", help="a rollout id, or a unique prefix of one")
    show.add_argument("--json", action="store_true", help="the rollout and its spans as JSON")
    show.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")

    tr = reader(
        "transitions",
        "the RL transitions of a store (credit assigned)",
        "One transition per policy-model call, with its credited reward (agl.transitions).",
    )
    tr.add_argument("--agents", nargs="+", metavar="NAME", help="keep only these agents' calls")
    tr.add_argument(
        "--credit",
        type=parse_credit,
        default=_credit.FinalReward(),
        metavar="RULE",
        help="final (default: the episode reward on every call) or discounted[:gamma] (gamma default 1)",
    )
    tr.add_argument(
        "--tool-success", type=float, default=None, help="AIR: reward a call whose tool succeeded"
    )
    tr.add_argument("--tool-error", type=float, default=None, help="AIR: reward a call whose tool failed")
    tr.add_argument("--rollout", action="append", metavar="ID", help="only this rollout (id or prefix)")
    tr.add_argument("--mode", choices=("train", "val", "trace"), help="only rollouts of this mode")
    tr.add_argument("--require-tokens", action="store_true", help="drop calls without exact token ids")
    tr.add_argument("--jsonl", "--json", dest="jsonl", action="store_true", help="one JSON per line")
    tr.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")

    sft = reader(
        "export-sft",
        "write chat-format JSONL for supervised fine-tuning",
        "Write {'messages': [...], 'reward': ...} per policy call (agl.export_sft).",
    )
    sft.add_argument("out", metavar="OUT.jsonl", help="the JSONL file to write")
    sft.add_argument("--min-reward", type=float, default=None, help="only rollouts with at least this reward")
    sft.add_argument("--agents", nargs="+", metavar="NAME", help="only these agents' calls")
    sft.add_argument("--mode", choices=("train", "val", "trace"), help="only rollouts of this mode")
    sft.add_argument("--json", action="store_true", help="print {'path': ..., 'records': N}")

    plot = reader(
        "plot",
        "draw the reward curve as a PNG",
        "Draw the reward curve: from metrics.jsonl next to DB (a training run) when there is one, "
        "else from the rollouts' rewards over time.",
    )
    plot.add_argument("--out", default=None, help="the PNG to write (default: DB's name + _reward_curve.png)")
    plot.add_argument(
        "--source",
        choices=("auto", "metrics", "rollouts"),
        default="auto",
        help="auto (default): metrics.jsonl when next to DB, else rollouts",
    )
    plot.add_argument("--metrics", default=None, help="a metrics.jsonl to plot (default: next to DB)")
    plot.add_argument("--mode", choices=("train", "val", "trace"), help="rollouts: only this mode")
    plot.add_argument("--json", action="store_true", help="print {'path': ..., 'source': ..., 'points': N}")
    return parser


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a policy model over the OpenAI API and record every call with its tokens",
        description=(
            "Serve a policy model at http://HOST:PORT/v1 (OpenAI-compatible). Every call is recorded as an "
            "'llm' span with exact token ids in the store (--db). Route calls to a rollout with the base URL "
            "http://HOST:PORT/rollout/<rollout_id>/v1."
        ),
    )
    serve.add_argument("--model", default="smollm2-135m", help="model name, Hugging Face id or local path")
    serve.add_argument(
        "--engine", choices=("hf", "vllm"), default="hf", help="inference engine (default: hf)"
    )
    serve.add_argument("--db", default=None, help="SQLite store to record into (default: in memory only)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    serve.add_argument(
        "--api-key",
        default=os.environ.get("AGL_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $AGL_API_KEY, else no key)",
    )
    serve.add_argument("--lora", default=None, help="a peft adapter directory to serve on top of the model")
    serve.add_argument("--device", default="auto", help="hf engine: auto, cpu, cuda... (default: auto)")
    serve.add_argument("--max-batch-size", type=int, default=16, help="most requests generated together")
    serve.add_argument(
        "--threads", type=int, default=None, help="hf engine: torch CPU threads (default: torch's)"
    )
    serve.add_argument("--served-name", default=None, help="the model name clients use (default: --model)")
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def _add_train(sub: Any) -> None:
    train = sub.add_parser(
        "train",
        help="train an agent (module:function) on a dataset file with GRPO or PPO on LoRA",
        description=(
            "Train an agent with agl.Trainer(...).fit(agent, dataset). AGENT is 'module:function' "
            "(imported with the current directory on sys.path), 'path/to/file.py:function', or the name "
            "of a benchmark package under benchmarks/ that provides `agent` and `load_dataset(split, "
            "data_dir=None)`. A `prepare(tasks)` function next to the agent, when there is one, runs "
            "once before training (to build an index, say). The agent is a function (task, llm) -> "
            "reward or an agl.LitAgent. The dataset is a JSONL file (one task per line) or a JSON list."
        ),
        epilog=_EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    train.add_argument(
        "agent", metavar="AGENT", help="module:function, file.py:function, or a benchmark name"
    )
    train.add_argument("--data", default=None, help="training tasks: a .jsonl file or a .json list")
    train.add_argument("--val-data", default=None, help="held-out tasks: success rate before and after")
    train.add_argument("--data-dir", default=None, help="benchmarks: where their data files are")
    train.add_argument("--limit", type=int, default=None, help="use only the first N training tasks")
    train.add_argument("--val-limit", type=int, default=None, help="use only the first N held-out tasks")
    train.add_argument("--model", default="smollm2-135m", help="policy model (default: smollm2-135m)")
    train.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo", help="default: grpo")
    train.add_argument("--steps", type=int, default=None, help="training steps (default: one epoch)")
    train.add_argument("--batch-size", type=int, default=8, help="tasks per step (default 8)")
    train.add_argument("--group-size", type=int, default=4, help="rollouts per task (default 4)")
    train.add_argument("--lr", type=float, default=1e-5, help="learning rate of the adapter (default 1e-5)")
    train.add_argument("--lora-r", type=int, default=16, help="LoRA rank (default 16)")
    train.add_argument("--qlora", action="store_true", help="4-bit base weights (QLoRA; CUDA GPU only)")
    train.add_argument("--engine", choices=("auto", "hf", "vllm"), default="auto", help="default: auto")
    train.add_argument("--agents", nargs="+", metavar="NAME", help="train only these agents' calls")
    train.add_argument(
        "--credit", type=parse_credit, default=None, metavar="RULE", help="final|discounted[:g]"
    )
    train.add_argument("--tool-success", type=float, default=None, help="AIR: reward for a tool that worked")
    train.add_argument("--tool-error", type=float, default=None, help="AIR: reward for a tool that failed")
    train.add_argument(
        "--concurrency", type=int, default=None, help="rollouts at once (default: a step's, batch x group)"
    )
    train.add_argument("--rollout-timeout", type=float, default=300.0, help="seconds per rollout")
    train.add_argument("--eval-every", type=int, default=0, help="validate every N steps (0 = at the end)")
    train.add_argument("--save-every", type=int, default=0, help="checkpoint every N steps (0 = never)")
    train.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    train.add_argument("--no-baseline", action="store_true", help="skip the evaluation before training")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--output-dir", default="runs/agl", help="runs.db, metrics, curve, adapter")
    train.add_argument("--json", action="store_true", help="print the results as JSON on stdout")


# -- agent and dataset loading ----------------------------------------------------------------------
def load_agent(spec: str) -> tuple[Any, Any]:
    """Import ``module:function``, ``file.py:function`` or a benchmark name; returns (agent, module)."""
    from .rl.rollouts import LitAgent

    if ":" in spec:
        where, _, attr = spec.rpartition(":")
    else:
        where, attr = f"benchmarks.{spec}", "agent"
    try:
        if where.endswith(".py") or os.sep in where:
            path = Path(where)
            if not path.is_file():
                raise CLIError(f"no such file: {path}", EXIT_USAGE)
            sys.path.insert(0, str(path.resolve().parent))
            mod_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert mod_spec is not None and mod_spec.loader is not None
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[path.stem] = module
            mod_spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(where)
    except ModuleNotFoundError as exc:
        raise CLIError(f"cannot import {where!r} for agent {spec!r}: {exc}", EXIT_USAGE) from None
    agent = getattr(module, attr, None)
    if agent is None:
        raise CLIError(f"{where!r} has no attribute {attr!r}", EXIT_USAGE)
    if isinstance(agent, type) and issubclass(agent, LitAgent):
        agent = agent()
    if not callable(agent):
        raise CLIError(f"agent {spec!r} is not callable", EXIT_USAGE)
    return agent, module


def load_tasks(path: str | os.PathLike[str], limit: int | None = None) -> list[Any]:
    """Tasks from a JSONL file (one per line) or a JSON list."""
    p = Path(path)
    if not p.is_file():
        raise CLIError(f"no such file: {p}", EXIT_USAGE)
    text = p.read_text(encoding="utf-8")
    try:
        stripped = text.lstrip()
        if stripped.startswith("["):
            tasks = json.loads(text)
        else:
            tasks = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise CLIError(f"{p} is neither JSONL nor a JSON list: {exc}", EXIT_USAGE) from None
    if not isinstance(tasks, list):
        raise CLIError(f"{p}: expected a JSON list of tasks", EXIT_USAGE)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        raise CLIError(f"{p} holds no tasks", EXIT_USAGE)
    return tasks


# -- commands ---------------------------------------------------------------------------------------
def _engine(args: argparse.Namespace) -> Any:
    from .serving import engines

    if args.engine == "vllm":
        return engines.VLLMEngine(args.model, lora=args.lora, model_name=args.served_name)
    return engines.HFEngine(
        args.model,
        lora=args.lora,
        device=args.device,
        max_batch_size=args.max_batch_size,
        model_name=args.served_name,
        num_threads=args.threads,
    )


def serve(args: argparse.Namespace) -> int:
    """Run ``agl-lite serve`` until Ctrl-C / SIGTERM."""
    from .serving import PolicyServer
    from .store import MemoryStore, SQLiteStore

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    store = SQLiteStore(args.db) if args.db else MemoryStore()
    print(f"agl-lite: loading {args.model} ({args.engine})...", file=sys.stderr, flush=True)
    engine = _engine(args)
    server = PolicyServer(
        engine,
        store,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        flush=True,  # other processes read the file: commit each call before answering
        log_level=args.log_level,
    )
    try:
        server.start()
        where = args.db if args.db else "memory (nothing kept after exit; pass --db runs.db)"
        print(
            f"agl-lite: serving model {server.model_name!r} at {server.base_url}\n"
            f"agl-lite: per-rollout base URL: {server.url}/rollout/<rollout_id>/v1\n"
            f"agl-lite: recording into {where}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever()
    finally:
        server.stop()
        engine.close()
        store.close()
    return 0


def _air(args: argparse.Namespace) -> list[Any] | None:
    if args.tool_success is None and args.tool_error is None:
        return None
    from .air import ToolStatus

    return [ToolStatus(success=args.tool_success or 0.0, error=args.tool_error or 0.0)]


def prepare_tasks(module: Any, tasks: list[Any]) -> None:
    """Call the agent module's ``prepare(tasks)`` when it defines one, before any rollout runs.

    A benchmark builds what its rollouts share there (MuSiQue: the search index over the corpus),
    so that the first rollouts do not spend their time limit on it.

    >>> import types
    >>> seen = []
    >>> prepare_tasks(types.SimpleNamespace(__name__="m", prepare=seen.extend), [{"q": 1}])
    >>> seen
    [{'q': 1}]
    """
    prepare = getattr(module, "prepare", None)
    if callable(prepare):
        _err(f"preparing {len(tasks)} tasks with {module.__name__}.prepare()")
        prepare(tasks)


def train(args: argparse.Namespace) -> int:
    """Run ``agl-lite train``: evaluate, ``Trainer.fit``, evaluate again, save the adapter."""
    for name in ("steps", "batch_size", "group_size", "lora_r", "concurrency"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CLIError(f"--{name.replace('_', '-')} must be >= 1", EXIT_USAGE)
    agent, module = load_agent(args.agent)
    if args.data is not None:
        tasks = load_tasks(args.data, args.limit)
    elif hasattr(module, "load_dataset"):
        tasks = list(module.load_dataset("train", data_dir=args.data_dir))[: args.limit]
    else:
        raise CLIError("--data FILE is required (a .jsonl file or a .json list of tasks)", EXIT_USAGE)
    val = None
    if args.val_data is not None:
        val = load_tasks(args.val_data, args.val_limit)
    elif args.data is None and hasattr(module, "load_dataset"):
        val = list(module.load_dataset("val", data_dir=args.data_dir))[: args.val_limit]
    prepare_tasks(module, tasks + (val or []))

    import agentlightning_lite as agl

    algo_cls = agl.GRPO if args.algorithm == "grpo" else agl.PPO
    _err(
        f"training {args.agent} on {len(tasks)} tasks: {args.model}, {args.algorithm.upper()}, "
        f"group {args.group_size}, batch {args.batch_size}, lr {args.lr:g}, output in {args.output_dir}"
    )
    t0 = time.time()
    trainer = agl.Trainer(
        model=args.model,
        algorithm=algo_cls(group_size=args.group_size, lr=args.lr),
        lora=agl.LoRA(r=args.lora_r, alpha=2 * args.lora_r, load_in_4bit=args.qlora),
        engine=args.engine,
        agents=_names(args.agents),
        credit=args.credit,
        air=_air(args),
        output_dir=args.output_dir,
        batch_size=args.batch_size,
        concurrency=args.concurrency,
        rollout_timeout=args.rollout_timeout,
        eval_every=args.eval_every,
        save_every=args.save_every,
        seed=args.seed,
    )
    try:
        before = None
        if val is not None and not args.no_baseline and not args.resume:
            before = trainer.evaluate(agent, val)
        last = trainer.fit(agent, tasks, steps=args.steps, resume=args.resume)
        after = trainer.evaluate(agent, val) if val is not None else None
        adapter = trainer.save()
        curve = trainer.plot()
    finally:
        trainer.close()
    out = {
        "agent": args.agent,
        "steps": trainer.step,
        "train_tasks": len(tasks),
        "before": before,
        "after": after,
        "last_metrics": {k: v for k, v in last.items() if isinstance(v, (int, float))},
        "output_dir": str(Path(args.output_dir)),
        "store": str(Path(args.output_dir) / "runs.db"),
        "metrics": str(Path(args.output_dir) / "metrics.jsonl"),
        "reward_curve": None if curve is None else str(curve),
        "adapter": str(adapter),
        "wall_s": round(time.time() - t0, 1),
    }
    if args.json:
        print(json.dumps(out, indent=2, default=_json_default))
        return EXIT_OK
    o = _Out()
    rows = [["steps", str(trainer.step), ""]]
    rows.append(["train reward (last step)", _fmt_num(last.get("train/reward_mean")), ""])
    if after is not None:
        for key in ("success_rate", "mean_reward"):
            rows.append([f"held-out {key}", _fmt_num(before[key]) if before else "-", _fmt_num(after[key])])
    o.table("training done", ["", "before", "after"], rows)
    for label in ("store", "metrics", "reward_curve", "adapter"):
        o.line(f"{label:13s} {out[label]}")
    return EXIT_OK


def _json_default(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def _open(args: argparse.Namespace) -> ReadOnlyStore:
    return ReadOnlyStore(args.db)


def runs(args: argparse.Namespace) -> int:
    """``agl-lite runs DB``: the rollouts, newest last, with status, reward, duration, agents."""
    store = _open(args)
    try:
        rollouts = store.rollouts(mode=args.mode, status=args.status)
        summary = store.span_summary()
    finally:
        store.close()
    total = len(rollouts)
    if not rollouts:
        _err(f"no rollouts in {args.db}" + (" matching the filters" if args.mode or args.status else ""))
        return EXIT_NOT_FOUND
    if args.limit and args.limit > 0:
        rollouts = rollouts[-args.limit :]
    items = []
    for r in rollouts:
        s = summary.get(r.rollout_id, {"spans": 0, "llm_calls": 0, "agents": []})
        items.append(
            {
                "rollout_id": r.rollout_id,
                "mode": r.mode,
                "status": r.status,
                "reward": r.reward,
                "start_time": r.start_time,
                "duration_s": None if r.end_time is None else r.end_time - r.start_time,
                "agents": s["agents"],
                "spans": s["spans"],
                "llm_calls": s["llm_calls"],
                "task": r.task,
                "error": r.error,
            }
        )
    if args.json:
        print(json.dumps(items, ensure_ascii=False, default=str))
        return EXIT_OK
    o = _Out(args.plain)
    rows = [
        [
            i["rollout_id"],
            i["status"],
            i["mode"],
            _fmt_num(i["reward"]),
            _fmt_dur(i["duration_s"]),
            ", ".join(i["agents"]) or "-",
            str(i["llm_calls"]),
            str(i["spans"]),
            _fmt_time(i["start_time"]),
            _preview(i["task"], 40),
        ]
        for i in items
    ]
    cols = ["rollout", "status", "mode", "reward", "duration", "agents", "llm", "spans", "started", "task"]
    o.table(f"{args.db}: {total} rollout(s)", cols, rows)
    if len(items) < total:
        o.line(f"showing the newest {len(items)} of {total}; --limit 0 shows all")
    by_status: dict[str, int] = {}
    for r in rollouts:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    rewards = [r.reward for r in rollouts if r.reward is not None]
    mean = f", mean reward {sum(rewards) / len(rewards):.4g}" if rewards else ""
    o.line(", ".join(f"{n} {s}" for s, n in sorted(by_status.items())) + mean)
    return EXIT_OK


def _resolve(store: ReadOnlyStore, prefix: str) -> str:
    matches = store.find_rollouts(prefix)
    if not matches:
        raise CLIError(f"no rollout with id or prefix {prefix!r} in {store.path}", EXIT_NOT_FOUND)
    if len(matches) > 1:
        shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
        raise CLIError(f"rollout id prefix {prefix!r} is ambiguous: {shown}", EXIT_USAGE)
    return matches[0]


def _span_label(s: Span, t0: float) -> str:
    parts = [f"{s.kind} {s.name}".strip()]
    if s.agent:
        parts.append(f"[{s.agent}]")
    parts.append(f"+{_fmt_dur(s.start_time - t0)}")
    parts.append(_fmt_dur(s.duration) if s.end_time is not None else "open")
    detail = ""
    if s.kind == "llm":
        bits = []
        if s.model:
            bits.append(s.model)
        if s.has_tokens:
            bits.append(f"{len(s.prompt_token_ids or [])}→{len(s.response_token_ids or [])} tok")
        if s.attributes.get("agl.duplicate_of"):
            bits.append(f"framework view of {str(s.attributes['agl.duplicate_of'])[:12]}")
        bits.append(repr(_preview(s.output, 50)))
        detail = " ".join(bits)
    elif s.kind == "tool":
        detail = f"{_preview(s.input, 40)} → " + (
            f"ERROR {_preview(s.error, 50)}" if s.status == "error" else _preview(s.output, 40)
        )
    elif s.kind == "reward":
        detail = f"= {_fmt_num(s.output if isinstance(s.output, (int, float)) else None)}"
        if s.attributes.get("final"):
            detail += " (final)"
    elif s.kind == "signal":
        detail = _preview(
            {k: v for k, v in {"value": s.output, "status": s.attributes.get("status")}.items() if v}
        )
    if s.status == "error" and s.kind != "tool":
        detail = (detail + " " if detail else "") + f"ERROR {_preview(s.error, 60)}"
    elif s.status == "ok" and s.kind == "tool":
        detail += "  ok"
    return "  ".join(parts) + (f"  {detail}" if detail else "")


def show(args: argparse.Namespace) -> int:
    """``agl-lite show DB ROLLOUT_ID``: one rollout's span tree."""
    store = _open(args)
    try:
        rid = _resolve(store, args.rollout_id)
        ro = store.get_rollout(rid)
        spans = store.spans(rid)
    finally:
        store.close()
    assert ro is not None
    if args.json:
        doc = {"rollout": ro.model_dump(mode="json"), "spans": [s.model_dump(mode="json") for s in spans]}
        print(json.dumps(doc, ensure_ascii=False))
        return EXIT_OK
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in spans:
        parent = s.parent_id if s.parent_id in ids else None
        children.setdefault(parent, []).append(s)

    def build(parent: str | None) -> list[tuple[str, list[Any]]]:
        kids = sorted(children.get(parent, []), key=lambda x: x.start_time)
        return [(_span_label(k, ro.start_time), build(k.span_id)) for k in kids]

    o = _Out(args.plain)
    dur = None if ro.end_time is None else ro.end_time - ro.start_time
    head = (
        f"rollout {ro.rollout_id}  {ro.status}  reward {_fmt_num(ro.reward)}  {ro.mode}  "
        f"{_fmt_dur(dur)}  started {_fmt_time(ro.start_time)}"
    )
    o.line(head, style="bold")
    o.line(f"task: {_preview(ro.task, 100)}")
    if ro.error:
        o.line(f"error: {ro.error}", style="red")
    tools = [s for s in spans if s.kind == "tool"]
    calls = [s for s in spans if s.kind == "llm" and not s.attributes.get("agl.duplicate_of")]
    failed = sum(s.status == "error" for s in tools)
    o.line(f"{len(spans)} spans, {len(calls)} LLM calls, {len(tools)} tool calls ({failed} failed)")
    if not spans:
        o.line("(no spans)")
        return EXIT_OK
    o.tree(f"{ro.rollout_id}", build(None))
    return EXIT_OK


def _collect_warnings(fn: Any) -> Any:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    for w in caught:
        _err(f"warning: {w.message}")
    return result


def transitions_cmd(args: argparse.Namespace) -> int:
    """``agl-lite transitions DB``: the transitions, as a table or JSONL."""
    from .transitions import transitions

    store = _open(args)
    try:
        rollout_ids = [_resolve(store, r) for r in args.rollout] if args.rollout else None
        items = _collect_warnings(
            lambda: transitions(
                store,
                rollout_ids=rollout_ids,
                agents=_names(args.agents),
                credit=args.credit,
                air=_air(args),
                mode=args.mode,
                require_tokens=args.require_tokens,
            )
        )
    finally:
        store.close()
    if not items:
        _err(f"no transitions (policy LLM calls) in {args.db} matching the filters")
        return EXIT_NOT_FOUND
    if args.jsonl:
        for t in items:
            sys.stdout.write(t.model_dump_json() + "\n")
        return EXIT_OK
    o = _Out(args.plain)
    rows = []
    for t in items:
        inter = t.metadata.get("intermediate_rewards") or []
        tokens = (
            f"{len(t.prompt_token_ids)}→{len(t.response_token_ids)}"
            if t.prompt_token_ids is not None and t.response_token_ids is not None
            else "-"
        )
        rows.append(
            [
                t.rollout_id,
                str(t.index),
                t.agent or "-",
                _fmt_num(t.reward),
                _fmt_num(t.final_reward),
                ", ".join(f"{n} {v:+.3g}" for n, v in inter) or "-",
                tokens,
                _preview(t.response, 50),
            ]
        )
    cols = ["rollout", "#", "agent", "credited", "final", "intermediate", "tokens", "response"]
    rule = args.credit
    o.table(f"{len(items)} transition(s), credit {rule!r}", cols, rows)
    return EXIT_OK


def export_sft_cmd(args: argparse.Namespace) -> int:
    """``agl-lite export-sft DB OUT.jsonl``."""
    from .sft import export_sft

    store = _open(args)
    out = Path(args.out)
    if out.exists() and out.resolve() == store.path.resolve():
        store.close()
        raise CLIError(f"refusing to overwrite the store {args.db} with the export", EXIT_USAGE)
    try:
        n = _collect_warnings(
            lambda: export_sft(
                store, out, min_reward=args.min_reward, agents=_names(args.agents), mode=args.mode
            )
        )
    finally:
        store.close()
    if args.json:
        print(json.dumps({"path": str(out), "records": n}))
    else:
        kept = f" (rollouts with reward >= {args.min_reward:g})" if args.min_reward is not None else ""
        print(f"wrote {n} chat example(s){kept} to {out}")
    if n == 0:
        _err("nothing exported: no policy calls matched")
        return EXIT_NOT_FOUND
    return EXIT_OK


def _rolling(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot(args: argparse.Namespace) -> int:
    """``agl-lite plot DB``: a reward-curve PNG from metrics.jsonl or from the rollouts."""
    store = _open(args)  # checks that DB exists and is ours, even when metrics are plotted
    try:
        rollouts = store.rollouts(mode=args.mode) if args.source != "metrics" else []
    finally:
        store.close()
    metrics = Path(args.metrics) if args.metrics else store.path.parent / "metrics.jsonl"
    if args.metrics and not metrics.is_file():
        raise CLIError(f"no such file: {metrics}", EXIT_USAGE)
    use_metrics = args.source == "metrics" or (args.source == "auto" and metrics.is_file())
    if args.source == "metrics" and not metrics.is_file():
        raise CLIError(f"no metrics.jsonl next to {args.db} (pass --metrics PATH)", EXIT_USAGE)
    out = Path(args.out) if args.out else store.path.with_name(store.path.stem + "_reward_curve.png")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise CLIError("plot needs matplotlib: pip install matplotlib", EXIT_RUNTIME) from None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if use_metrics:
        rows = [json.loads(x) for x in metrics.read_text(encoding="utf-8").splitlines() if x.strip()]
        series = {
            "train/reward_mean": ("train reward (mean)", "-", "#4C72B0"),
            "val/reward_mean": ("val reward (mean)", "o-", "#DD8452"),
            "val/success_rate": ("val success rate", "s--", "#55A868"),
        }
        points = 0
        for key, (label, fmt, color) in series.items():
            xy = [
                (r["step"], r[key])
                for r in rows
                if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])
            ]
            if xy:
                points += len(xy)
                ax.plot(*zip(*xy, strict=True), fmt, label=label, color=color)
        ax.set_xlabel("training step")
        source = str(metrics)
    else:
        done = [r for r in rollouts if r.reward is not None]
        points = len(done)
        if done:
            t0 = min(r.start_time for r in done)
            by_mode: dict[str, list[Rollout]] = {}
            for r in sorted(done, key=lambda r: r.end_time or r.start_time):
                by_mode.setdefault(r.mode, []).append(r)
            colors = {"train": "#4C72B0", "val": "#DD8452", "trace": "#55A868"}
            for mode, items in by_mode.items():
                xs = [((r.end_time or r.start_time) - t0) / 60.0 for r in items]
                ys = [float(r.reward) for r in items]  # type: ignore[arg-type]
                ax.scatter(xs, ys, s=8, alpha=0.3, color=colors.get(mode))
                window = max(1, len(ys) // 20)
                ax.plot(xs, _rolling(ys, window), color=colors.get(mode), label=f"{mode} (mean of {window})")
        ax.set_xlabel("minutes since the first rollout")
        source = "rollouts"
    if points == 0:
        plt.close(fig)
        _err(f"no rewards to plot in {source if use_metrics else args.db}")
        return EXIT_NOT_FOUND
    ax.set_ylabel("reward")
    ax.set_title(f"reward curve: {store.path.name}")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    if args.json:
        print(json.dumps({"path": str(out), "source": source, "points": points}))
    else:
        print(f"wrote {out} ({points} points from {source})")
    return EXIT_OK


_COMMANDS = {
    "serve": serve,
    "train": train,
    "runs": runs,
    "show": show,
    "transitions": transitions_cmd,
    "export-sft": export_sft_cmd,
    "plot": plot,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agl-lite`` command; returns the exit code (see ``agl-lite --help``)."""
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
        _err(f"error: {exc}")
        return exc.code
    except NotOurDatabase as exc:
        _err(f"error: {exc}")
        return EXIT_USAGE
    except BrokenPipeError:  # `agl-lite runs db | head`
        return EXIT_OK
    except Exception as exc:
        _err(
            f"error: {type(exc).__name__}: {exc}"
            if not isinstance(exc, (OSError, ValueError))
            else f"error: {exc}"
        )
        return EXIT_RUNTIME


if __name__ == "__main__":
    sys.exit(main())
