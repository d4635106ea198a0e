"""``agl-lite runs`` and ``agl-lite show``: list a store's rollouts, and one rollout's span tree."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..store.recovery import INTERRUPTED, stale_running
from ..types import Span
from ._common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    Out,
    fmt_dur,
    fmt_num,
    fmt_time,
    preview,
    print_error,
    reader_parser,
)
from .readstore import ReadOnlyStore, open_store


def add_parsers(sub: Any) -> None:
    """The ``runs`` and ``show`` sub-commands."""
    runs = reader_parser(
        sub, "runs", "list the rollouts of a store", "List rollouts: status, reward, duration, agents."
    )
    runs.add_argument("--mode", choices=("train", "val", "trace"), help="only rollouts of this mode")
    runs.add_argument(
        "--status", choices=("running", "succeeded", "failed", "timeout"), help="only this status"
    )
    runs.add_argument("--limit", type=int, default=50, help="show the newest N (default 50; 0 = all)")
    runs.add_argument("--json", action="store_true", help="a JSON list on stdout")
    runs.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")

    show = reader_parser(
        sub, "show", "show one rollout's span tree", "The span tree of one rollout: timings, tools, rewards."
    )
    show.add_argument("rollout_id", metavar="ROLLOUT_ID", help="a rollout id, or a unique prefix of one")
    show.add_argument("--json", action="store_true", help="the rollout and its spans as JSON")
    show.add_argument("--plain", action="store_true", help="plain text, no colours or boxes")


def runs(args: argparse.Namespace) -> int:
    """``agl-lite runs DB``: the rollouts, newest last, with status, reward, duration, agents."""
    store = open_store(args)
    try:
        rollouts = store.rollouts(mode=args.mode, status=args.status)
        summary = store.span_summary()
    finally:
        store.close()
    total = len(rollouts)
    if not rollouts:
        filtered = " matching the filters" if args.mode or args.status else ""
        print_error(f"no rollouts in {args.db}{filtered}")
        return EXIT_NOT_FOUND
    if args.limit and args.limit > 0:
        rollouts = rollouts[-args.limit :]
    gone = {r.rollout_id for r in stale_running(rollouts)}
    items = []
    for r in rollouts:
        s = summary.get(r.rollout_id, {"spans": 0, "llm_calls": 0, "agents": []})
        items.append(
            {
                "rollout_id": r.rollout_id,
                "mode": r.mode,
                "status": r.status,
                "process_gone": r.rollout_id in gone,
                "reward": r.reward,
                "start_time": r.start_time,
                # an interrupted rollout ended at an unknown time (before it was marked)
                "duration_s": None
                if r.end_time is None or r.error == INTERRUPTED
                else r.end_time - r.start_time,
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
    o = Out(args.plain)
    rows = [
        [
            i["rollout_id"],
            _status_cell(i),
            i["mode"],
            fmt_num(i["reward"]),
            fmt_dur(i["duration_s"]),
            ", ".join(i["agents"]) or "-",
            str(i["llm_calls"]),
            str(i["spans"]),
            fmt_time(i["start_time"]),
            preview(i["task"], 40),
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
    if gone:
        o.line(
            f"{len(gone)} running? = left running by a process that is gone; "
            f"`agl-lite recover {args.db}` marks them failed ({INTERRUPTED})",
            style="yellow",
        )
    return EXIT_OK


def _status_cell(item: dict[str, Any]) -> str:
    """``running?`` for a rollout whose process is gone, ``failed (interrupted)`` once recovered."""
    if item["process_gone"]:
        return "running?"
    if item["status"] == "failed" and item["error"] == INTERRUPTED:
        return f"failed ({INTERRUPTED})"
    return str(item["status"])


def resolve_rollout(store: ReadOnlyStore, prefix: str) -> str:
    """The one rollout id that ``prefix`` names (an exact id or a unique prefix); else a CLIError."""
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
    parts.append(f"+{fmt_dur(s.start_time - t0)}")
    parts.append(fmt_dur(s.duration) if s.end_time is not None else "open")
    detail = ""
    if s.kind == "llm":
        bits = []
        if s.model:
            bits.append(s.model)
        if s.has_tokens:
            bits.append(f"{len(s.prompt_token_ids or [])}→{len(s.response_token_ids or [])} tok")
        if s.attributes.get("agl.duplicate_of"):
            bits.append(f"framework view of {str(s.attributes['agl.duplicate_of'])[:12]}")
        bits.append(repr(preview(s.output, 50)))
        detail = " ".join(bits)
    elif s.kind == "tool":
        detail = f"{preview(s.input, 40)} → " + (
            f"ERROR {preview(s.error, 50)}" if s.status == "error" else preview(s.output, 40)
        )
    elif s.kind == "reward":
        detail = f"= {fmt_num(s.output if isinstance(s.output, (int, float)) else None)}"
        if s.attributes.get("final"):
            detail += " (final)"
    elif s.kind == "signal":
        detail = preview(
            {k: v for k, v in {"value": s.output, "status": s.attributes.get("status")}.items() if v}
        )
    if s.status == "error" and s.kind != "tool":
        detail = (detail + " " if detail else "") + f"ERROR {preview(s.error, 60)}"
    elif s.status == "ok" and s.kind == "tool":
        detail += "  ok"
    return "  ".join(parts) + (f"  {detail}" if detail else "")


def show(args: argparse.Namespace) -> int:
    """``agl-lite show DB ROLLOUT_ID``: one rollout's span tree."""
    store = open_store(args)
    try:
        rid = resolve_rollout(store, args.rollout_id)
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

    o = Out(args.plain)
    dur = None if ro.end_time is None else ro.end_time - ro.start_time
    head = (
        f"rollout {ro.rollout_id}  {ro.status}  reward {fmt_num(ro.reward)}  {ro.mode}  "
        f"{fmt_dur(dur)}  started {fmt_time(ro.start_time)}"
    )
    o.line(head, style="bold")
    o.line(f"task: {preview(ro.task, 100)}")
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
