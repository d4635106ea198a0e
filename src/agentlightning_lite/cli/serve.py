"""``agl-lite serve``: serve a policy model over the OpenAI API and record every call."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Any

from ._common import EXIT_USAGE, CLIError, add_parser_flags, parser_options


def add_parser(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve a policy model over the OpenAI API and record every call with its tokens",
        description=(
            "Serve a policy model at http://HOST:PORT/v1 (OpenAI-compatible). Every call is recorded as an "
            "'llm' span with exact token ids in the store (--db). Route calls to a rollout with the base URL "
            "http://HOST:PORT/rollout/<rollout_id>/v1. OpenTelemetry spans (OTLP/HTTP, protobuf or JSON) "
            "are taken at http://HOST:PORT/v1/traces (same API key), filed under the rollout named by the "
            "span or resource attribute agentlightning.rollout_id, another span of the same trace, the "
            "X-Agl-Rollout-Id header or the URL /rollout/<rollout_id>/v1/traces; a rollout the store "
            "does not have is started (mode trace), and a trace that names none is a trace rollout of its "
            "own (otel-<trace id>). Besides Chat Completions, the OpenAI Responses API (/v1/responses, "
            "Codex) and the Anthropic Messages API (/v1/messages, Claude Code: ANTHROPIC_BASE_URL="
            "http://HOST:PORT, key as x-api-key or Bearer) are served through the same engine path."
        ),
    )
    serve.add_argument(
        "--model",
        default=None,
        help="model name, Hugging Face id or local path (default: smollm2-135m; with --engine http: the "
        "model the first --url server lists)",
    )
    serve.add_argument(
        "--engine",
        choices=("hf", "vllm", "http"),
        default="hf",
        help="hf: transformers in this process (default); vllm: start `vllm serve`, or attach to the "
        "vLLM servers at --url; http: generate through any server at --url that speaks vLLM's token-id "
        "HTTP subset (another agl-lite serve, say)",
    )
    serve.add_argument(
        "--url",
        nargs="+",
        default=None,
        metavar="URL",
        help="vllm/http: the inference servers (http://host:port); a rollout's calls stay on one of them",
    )
    serve.add_argument(
        "--tokenizer",
        default=None,
        help="http: the served model's tokenizer (a Hugging Face id or path; default: --model)",
    )
    serve.add_argument(
        "--backend-api-key",
        default=os.environ.get("AGL_BACKEND_API_KEY"),
        help="vllm/http: the key of the servers at --url (default: $AGL_BACKEND_API_KEY, else none)",
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
    serve.add_argument(
        "--clamp-max-tokens",
        choices=("auto", "all", "off"),
        default="auto",
        help="a max_tokens larger than the context leaves: 'auto' cuts it to fit on /v1/responses and "
        "/v1/messages and answers OpenAI's 400 on chat and text completions; 'all' cuts it everywhere "
        "(opencode asks for 32000 by default); 'off' answers 400 everywhere (default: auto)",
    )
    add_parser_flags(serve)
    serve.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


# -- commands ---------------------------------------------------------------------------------------
DEFAULT_MODEL = "smollm2-135m"


def _tokenizer(name: str) -> Any:
    """A tokenizer by name: a model this package knows (``smollm2-135m``) gets its own; else the name
    (a Hugging Face id or path, or ``bytes``) goes to the engine as it is."""
    from .. import models

    return models.load_tokenizer(name) if name.lower() in models.KNOWN_MODELS else name


def _engine(args: argparse.Namespace) -> Any:
    from ..serving import engines

    if args.url and args.engine == "hf":
        raise CLIError("--url is for --engine vllm or --engine http", EXIT_USAGE)
    if args.engine == "http":
        if not args.url:
            raise CLIError("--engine http needs --url (the inference servers)", EXIT_USAGE)
        tokenizer = args.tokenizer or args.model
        if tokenizer is None:
            raise CLIError("--engine http needs --tokenizer (or --model): the served model's", EXIT_USAGE)
        return engines.HTTPEngine(
            args.url,
            tokenizer=_tokenizer(tokenizer),
            model=args.model,
            api_key=args.backend_api_key,
            lora=args.lora,
            model_name=args.served_name,
        )
    model = args.model or DEFAULT_MODEL
    if args.engine == "vllm":
        return engines.VLLMEngine(
            model,
            lora=args.lora,
            model_name=args.served_name,
            url=args.url,
            api_key=args.backend_api_key,
            tokenizer=None if args.tokenizer is None else _tokenizer(args.tokenizer),
        )
    return engines.HFEngine(
        model,
        lora=args.lora,
        device=args.device,
        max_batch_size=args.max_batch_size,
        model_name=args.served_name,
        num_threads=args.threads,
    )


def make_server(engine: Any, store: Any, **options: Any) -> Any:
    """The PolicyServer of ``agl-lite serve``: the OpenAI routes and OTLP/HTTP ``/v1/traces``."""
    from ..remote.otlp import otlp_routes
    from ..serving import PolicyServer

    class ServeServer(PolicyServer):
        """A PolicyServer that also takes OpenTelemetry spans (as the trainer's runner routes do)."""

        def extra_routes(self) -> list[Any]:
            return [*super().extra_routes(), *otlp_routes(self)]

    return ServeServer(engine, store, **options)


def serve(args: argparse.Namespace) -> int:
    """Run ``agl-lite serve`` until Ctrl-C / SIGTERM."""
    from ..store import MemoryStore, SQLiteStore

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    store = SQLiteStore(args.db) if args.db else MemoryStore()
    what = " ".join(args.url) if args.url else (args.model or DEFAULT_MODEL)
    print(f"agl-lite: loading {what} ({args.engine})...", file=sys.stderr, flush=True)
    parsers = parser_options(args)
    engine = _engine(args)
    server = make_server(
        engine,
        store,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        flush=True,  # other processes read the file: commit each call before answering
        log_level=args.log_level,
        clamp_max_tokens={"auto": None, "all": True, "off": False}[args.clamp_max_tokens],
        **parsers,
    )
    try:
        server.start()
        where = args.db if args.db else "memory (nothing kept after exit; pass --db runs.db)"
        print(
            f"agl-lite: serving model {server.model_name!r} at {server.base_url}\n"
            f"agl-lite: per-rollout base URL: {server.url}/rollout/<rollout_id>/v1\n"
            f"agl-lite: APIs: /v1/chat/completions, /v1/completions, /v1/responses (OpenAI), "
            f"/v1/messages (Anthropic: base URL {server.url})\n"
            f"agl-lite: OpenTelemetry spans (OTLP/HTTP): {server.url}/v1/traces\n"
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
