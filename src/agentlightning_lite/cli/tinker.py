"""``agl-lite tinker``: serve the Tinker training API (the official ``tinker`` SDK trains LoRA here)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ._common import EXIT_USAGE, CLIError

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "tinker",
        help="serve a Tinker-compatible training API (LoRA training and sampling for the tinker SDK)",
        description=(
            "Serve the Tinker API at http://HOST:PORT/api/v1: the official tinker SDK (0.38) creates LoRA "
            "training clients on the model, runs forward_backward (cross_entropy, importance_sampling, ppo, "
            "cispo), optim_step (AdamW), saves and loads tinker:// checkpoints under --output-dir, and "
            "samples with exact token logprobs. Clients set TINKER_BASE_URL=http://HOST:PORT and "
            "TINKER_API_KEY=tml-<anything> (the SDK refuses keys without the tml- prefix; with --api-key, "
            "that key). Binding anything but 127.0.0.1 needs --api-key. What is refused: docs/tinker.md."
        ),
    )
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name, Hugging Face id or local directory (default: smollm2-135m; clients may also name "
        "it by its Hugging Face id, HuggingFaceTB/SmolLM2-135M-Instruct)",
    )
    p.add_argument(
        "--engine",
        choices=("hf", "vllm"),
        default="hf",
        help="hf: transformers in this process trains and samples (CPU or GPU); vllm: a vLLM server samples "
        "(started here, or --vllm-url) while a transformers copy trains (default: hf)",
    )
    p.add_argument(
        "--vllm-url",
        default=None,
        metavar="URL",
        help="with --engine vllm: attach to this running vLLM server (started with --enable-lora and "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True) instead of starting one",
    )
    p.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        help="with --engine vllm: the largest LoRA rank clients may ask for (vLLM's --max-lora-rank; "
        "default: 64)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default: 8000; 0 picks a free one)")
    p.add_argument(
        "--output-dir",
        default="tinker-runs",
        help="where tinker:// checkpoints are saved, and the store unless --store names one "
        "(default: tinker-runs)",
    )
    p.add_argument(
        "--store",
        default=None,
        metavar="PATH",
        help="the SQLite store that records every training and sampling call, read by agl-lite runs / "
        "show / ui (default: OUTPUT_DIR/store.sqlite)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("AGL_API_KEY"),
        help="require this key as X-API-Key (default: $AGL_API_KEY, else none)",
    )
    p.add_argument(
        "--max-body-mb",
        type=float,
        default=256.0,
        help="the largest request body in MiB, a zstd forward_backward batch once decompressed too "
        "(larger ones get a 413; default: 256)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda... (default: auto)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0, help="seeds samples that bring no seed (default: 0)")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def tinker(args: argparse.Namespace) -> int:
    """Run ``agl-lite tinker`` until Ctrl-C / SIGTERM."""
    if args.host not in LOOPBACK and not args.api_key:
        raise CLIError(f"serving on {args.host} (not 127.0.0.1) needs --api-key", EXIT_USAGE)
    try:
        from ..store.sqlite import SQLiteStore
        from ..tinker import TinkerServer, build_backend
        from ..tinker.server import STORE_FILE
    except ImportError as exc:
        raise CLIError(
            f"agl-lite tinker needs the serve and tinker extras ({exc}): "
            "pip install 'agentlightning-lite[serve,tinker]'",
            EXIT_USAGE,
        ) from None
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    print(f"agl-lite: loading {args.model} ({args.engine})...", file=sys.stderr, flush=True)
    if not args.max_body_mb > 0:
        raise CLIError(f"--max-body-mb must be positive, got {args.max_body_mb}", EXIT_USAGE)
    if args.max_lora_rank is not None and args.max_lora_rank < 1:
        raise CLIError(f"--max-lora-rank must be at least 1, got {args.max_lora_rank}", EXIT_USAGE)
    if args.vllm_url and args.max_lora_rank is None:
        raise CLIError(
            "--vllm-url needs --max-lora-rank: the attached server's own --max-lora-rank "
            "(vLLM's default is 16)",
            EXIT_USAGE,
        )
    if args.engine != "vllm" and (args.vllm_url or args.max_lora_rank):
        raise CLIError("--vllm-url and --max-lora-rank go with --engine vllm", EXIT_USAGE)
    vllm_options: dict[str, Any] = {}
    if args.vllm_url:
        vllm_options["url"] = args.vllm_url
    if args.max_lora_rank:
        vllm_options["max_lora_rank"] = args.max_lora_rank
    try:
        backend = build_backend(
            args.model,
            args.engine,
            output_dir=args.output_dir,
            vllm_options=vllm_options,
            device=args.device,
            num_threads=args.threads,
            seed=args.seed,
        )
    except ImportError as exc:  # vLLM is not installed (VLLMEngine's message says how)
        raise CLIError(str(exc), EXIT_USAGE) from None
    store = SQLiteStore(args.store) if args.store else None
    store_path = args.store or os.path.join(args.output_dir, STORE_FILE)
    server = TinkerServer(
        backend,
        args.output_dir,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        log_level=args.log_level,
        store=store,
        max_body_bytes=int(args.max_body_mb * 2**20),
    )
    try:
        server.start()
        names = ", ".join(backend.base_model_names())
        print(
            f"agl-lite: Tinker API at {server.url}/api/v1 (base_model: {names})\n"
            f"agl-lite: clients: TINKER_BASE_URL={server.url} TINKER_API_KEY="
            f"{args.api_key if args.api_key else 'tml-local'}\n"
            f"agl-lite: checkpoints under {os.path.abspath(args.output_dir)}, calls recorded in "
            f"{os.path.abspath(store_path)} (agl-lite runs {store_path}); Ctrl-C to stop",
            file=sys.stderr,
            flush=True,
        )
        server.serve_forever()
    finally:
        server.close()
        if store is not None:
            store.close()
    return 0
