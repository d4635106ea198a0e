"""``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter`` and ``GET /version``.

The same bodies and answers as vLLM's OpenAI server (``{"lora_name": ..., "lora_path": ...}``;
``200`` with a plain-text ``Success: ...`` line; an OpenAI error body otherwise), so an engine that
drives vLLM over HTTP drives this server too. A loaded adapter is served to requests whose
``model`` names it. Only adapters loaded through this route can be unloaded through it (the engine's
own, trained ones stay). The adapter directory is read by the server process: it must be a path on
the server's machine. The same API key rule as the generation routes applies.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from ...version import __version__
from ..context import ServingContext
from ..engines.contract import AdapterRemovingEngine, MultiAdapterEngine, TrainableEngine
from ..errors import APIError, JSONResponse, bad_request
from .request import check_auth, read_json


def _name(body: dict[str, Any], key: str = "lora_name") -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"'{key}' must be a non-empty string", key)
    return value


async def load_lora_adapter(ctx: ServingContext, request: Request) -> Response:
    """Load a peft adapter directory as ``lora_name`` (``load_inplace``: replace a loaded one's weights)."""
    check_auth(ctx, request)
    body = await read_json(request, ctx.settings.max_body_bytes)
    name = _name(body)
    path = body.get("lora_path")
    if not isinstance(path, str) or not path:
        raise bad_request("Both 'lora_name' and 'lora_path' must be provided.", "lora_path")
    engine = ctx.engine
    if not isinstance(engine, MultiAdapterEngine):
        raise bad_request(f"{type(engine).__name__} cannot load LoRA adapters", "lora_name")
    if name in ctx.served_names:
        raise bad_request(f"The lora adapter '{name}' conflicts with a served base model.", "lora_name")
    if "." in name or "@" in name:
        raise bad_request(f"an adapter name cannot contain '.' or '@': {name!r}", "lora_name")
    if not os.path.isfile(os.path.join(path, "adapter_config.json")):
        raise APIError(
            404,
            f"Loading lora {name} failed: No adapter found for {path} (no adapter_config.json there)",
            type="NotFoundError",
            param="lora_path",
            code="lora_not_found",
        )
    inplace = body.get("load_inplace") is True
    async with ctx.lora_lock:
        loaded = name in ctx.lora_adapters
        if loaded and not inplace:
            raise bad_request(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
                "lora_name",
            )
        if not loaded and name in engine.adapters:
            raise bad_request(f"'{name}' is one of the engine's own adapters", "lora_name")
        job: Callable[[], object]
        if loaded:
            if not isinstance(engine, TrainableEngine):
                raise bad_request(
                    f"{type(engine).__name__} cannot replace an adapter's weights", "load_inplace"
                )
            job = functools.partial(engine.update_weights, path, name)
        else:
            job = functools.partial(engine.add_adapter, name, path, False, named_only=True)
        try:
            await run_in_threadpool(job)
        except (ValueError, OSError, KeyError, TypeError) as exc:
            raise bad_request(f"Loading lora {name} failed: {exc}", "lora_path") from None
        ctx.lora_adapters[name] = path
    return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")


async def unload_lora_adapter(ctx: ServingContext, request: Request) -> Response:
    """Unload an adapter loaded with :func:`load_lora_adapter` (404 for any other name)."""
    check_auth(ctx, request)
    body = await read_json(request, ctx.settings.max_body_bytes)
    name = _name(body)
    engine = ctx.engine
    async with ctx.lora_lock:
        if name not in ctx.lora_adapters or not isinstance(engine, AdapterRemovingEngine):
            raise APIError(
                404,
                f"The lora adapter '{name}' cannot be found.",
                type="NotFoundError",
                param="lora_name",
                code="lora_not_found",
            )
        await run_in_threadpool(engine.remove_adapter, name)
        del ctx.lora_adapters[name]
    return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")


async def version(ctx: ServingContext, request: Request) -> Response:
    """The server's version (vLLM answers its own here: ``{"version": "0.33.0"}``)."""
    return JSONResponse({"version": __version__, "server": "agentlightning-lite"})
