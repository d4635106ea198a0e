"""``GET /v1/models`` and ``GET /health``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import Response

from ..errors import JSONResponse
from .calls import _routed_to, check_auth, rollout_of

if TYPE_CHECKING:
    from ..server import PolicyServer


async def models(server: PolicyServer, request: Request) -> Response:
    """The served model names (the base name and its aliases)."""
    check_auth(server, request, _routed_to(request))
    await rollout_of(server, request)
    created = int(time.time())
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "agentlightning-lite"}
        for name in sorted(server.served_names)
    ]
    return JSONResponse({"object": "list", "data": data})


async def health(server: PolicyServer, request: Request) -> Response:
    """Liveness, the model name and the weights version (no key needed)."""
    return JSONResponse(
        {"status": "ok", "model": server.model_name, "weights_version": server.engine.version}
    )
