"""``agl-lite transitions`` and ``agl-lite export-sft``: a store's RL transitions and SFT records."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import credit as _credit
from ..run_settings import recorded, rules
from ._common import (
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    CLIError,
    Out,
    air_rules,
    collect_warnings,
    fmt_num,
    name_list,
    parse_credit,
    preview,
    print_error,
    reader_parser,
)
from .readstore import open_store
from .runs import resolve_rollout


def add_parsers(sub: Any) -> None:
    """The ``transitions`` and ``export-sft`` sub-commands."""
    tr = reader_parser(
        sub,
        "transitions",
        "the RL transitions of a store (credit assigned)",
        "One transition per policy-model call, with its credited reward (agl.transitions).",
    )
    tr.add_argument("--agents", nargs="+", metavar="NAME", help="keep only these agents' calls")
    tr.add_argument(
        "--credit",
        type=parse_credit,
        default=None,
        metavar="RULE",
        help="final (the episode reward on every call) or discounted[:gamma] (gamma default 1); default: the "
        "rule the training run recorded with its rollouts, else final",
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

    sft = reader_parser(
        sub,
        "export-sft",
        "write chat-format JSONL for supervised fine-tuning",
        "Write {'messages': [...], 'reward': ...} per policy call (agl.export_sft).",
    )
    sft.add_argument("out", metavar="OUT.jsonl", help="the JSONL file to write")
    sft.add_argument("--min-reward", type=float, default=None, help="only rollouts with at least this reward")
    sft.add_argument("--agents", nargs="+", metavar="NAME", help="only these agents' calls")
    sft.add_argument("--mode", choices=("train", "val", "trace"), help="only rollouts of this mode")
    sft.add_argument("--json", action="store_true", help="print {'path': ..., 'records': N}")


def transitions_cmd(args: argparse.Namespace) -> int:
    """``agl-lite transitions DB``: the transitions, as a table or JSONL."""
    from ..transitions import transitions

    store = open_store(args)
    credit, air = args.credit, air_rules(args)
    if credit is None and air is None and (spec := recorded(store)) is not None:
        credit, air = rules(spec)  # what the run trained with
    args.credit = credit if credit is not None else _credit.FinalReward()
    try:
        rollout_ids = [resolve_rollout(store, r) for r in args.rollout] if args.rollout else None
        items = collect_warnings(
            lambda: transitions(
                store,
                rollout_ids=rollout_ids,
                agents=name_list(args.agents),
                credit=args.credit,
                air=air,
                mode=args.mode,
                require_tokens=args.require_tokens,
            )
        )
    finally:
        store.close()
    if not items:
        print_error(f"no transitions (policy LLM calls) in {args.db} matching the filters")
        return EXIT_NOT_FOUND
    if args.jsonl:
        for t in items:
            sys.stdout.write(t.model_dump_json() + "\n")
        return EXIT_OK
    o = Out(args.plain)
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
                fmt_num(t.reward),
                fmt_num(t.final_reward),
                ", ".join(f"{n} {v:+.3g}" for n, v in inter) or "-",
                tokens,
                preview(t.response, 50),
            ]
        )
    cols = ["rollout", "#", "agent", "credited", "final", "intermediate", "tokens", "response"]
    rule = args.credit
    o.table(f"{len(items)} transition(s), credit {rule!r}", cols, rows)
    return EXIT_OK


def export_sft_cmd(args: argparse.Namespace) -> int:
    """``agl-lite export-sft DB OUT.jsonl``."""
    from ..sft_export import export_sft

    store = open_store(args)
    out = Path(args.out)
    if out.exists() and out.resolve() == store.path.resolve():
        store.close()
        raise CLIError(f"refusing to overwrite the store {args.db} with the export", EXIT_USAGE)
    try:
        n = collect_warnings(
            lambda: export_sft(
                store, out, min_reward=args.min_reward, agents=name_list(args.agents), mode=args.mode
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
        print_error("nothing exported: no policy calls matched")
        return EXIT_NOT_FOUND
    return EXIT_OK
