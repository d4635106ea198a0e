"""``agl-lite ui``: a local web view of a store of runs and of a training run's metrics."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ._common import EXIT_USAGE, CLIError, air_rules, name_list, parse_credit, reader_parser


def add_parser(sub: Any) -> None:
    p = reader_parser(
        sub,
        "ui",
        "a local web view of the rollouts, their spans, the tokens trained and the training run",
        "Serve a web page (http://HOST:PORT/) showing the store's rollouts (filter, sort, pages), each "
        "rollout's span tree, the response tokens of each call shaded by the advantage or reward they "
        "were trained with, and, with --output-dir, the run's metrics.jsonl (followed while it grows). "
        "The store is opened read-only. Binding anything but 127.0.0.1 needs --api-key.",
    )
    p.add_argument("--output-dir", default=None, help="the training run's output_dir (its metrics.jsonl)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default: 8765; 0 picks a free one)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("AGL_API_KEY"),
        help="require this key (open the page once as /?key=KEY; default: $AGL_API_KEY, else none)",
    )
    p.add_argument("--model", default=None, help="decode token ids with this model's tokenizer")
    p.add_argument("--agents", nargs="+", metavar="NAME", help="the agents that were trained (default: all)")
    p.add_argument(
        "--credit",
        type=parse_credit,
        default=None,
        metavar="RULE",
        help="the run's credit rule: final or discounted[:gamma] (default: the run's own, else final)",
    )
    p.add_argument("--tool-success", type=float, default=None, help="the run's AIR reward for a tool success")
    p.add_argument("--tool-error", type=float, default=None, help="the run's AIR reward for a tool error")
    p.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"))


def ui(args: argparse.Namespace) -> int:
    """Run ``agl-lite ui`` until Ctrl-C / SIGTERM."""
    try:
        from ..ui import RunData, UIServer
    except ImportError as exc:
        raise CLIError(
            f"agl-lite ui needs starlette, uvicorn and jinja2 ({exc}): pip install 'agentlightning-lite[ui]'",
            EXIT_USAGE,
        ) from None
    from .readstore import ReadOnlyStore

    store = ReadOnlyStore(args.db)
    tokenizer = None
    if args.model:
        from ..models import load_tokenizer

        print(f"agl-lite: loading the tokenizer of {args.model}...", file=sys.stderr, flush=True)
        tokenizer = load_tokenizer(args.model)
    data = RunData(
        store,
        output_dir=args.output_dir,
        tokenizer=tokenizer,
        credit=args.credit,
        air=air_rules(args),
        agents=name_list(args.agents),
    )
    try:
        server = UIServer(
            data, host=args.host, port=args.port, api_key=args.api_key, log_level=args.log_level
        )
    except ValueError as exc:
        store.close()
        raise CLIError(str(exc), EXIT_USAGE) from None
    try:
        server.start()
        key = "?key=<your key>" if args.api_key else ""
        print(
            f"agl-lite: web view of {args.db} at {server.url}/{key}; Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever()
    finally:
        server.stop()
        store.close()
    return 0
