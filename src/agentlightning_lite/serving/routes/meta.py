"""``GET /v1/models`` and ``GET /health``."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response

from ..context import ServingContext
from ..errors import JSONResponse
from .request import check_auth, rollout_of, routed_to


async def models(ctx: ServingContext, request: Request) -> Response:
    """The served model names (the base name and its aliases)."""
    check_auth(ctx, request, routed_to(request))
    await rollout_of(ctx, request)
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "agentlightning-lite"}
        for name in sorted(ctx.served_names)
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(ctx: ServingContext, request: Request) -> Response:
    """Liveness, the model name and the weights version (no key needed)."""
    return JSONResponse({"status": "ok", "model": ctx.model_name, "weights_version": ctx.engine.version})
