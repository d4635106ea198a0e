"""Policy serving: an OpenAI-compatible server that records every call with exact tokens, and its engines.

The engines load without the server's web stack (starlette, uvicorn): ``PolicyServer`` and ``LLM``
are imported on first use.

>>> import agentlightning_lite as agl
>>> from agentlightning_lite.serving import PolicyServer, engines
>>> store = agl.MemoryStore()
>>> with PolicyServer(engines.ScriptedEngine(["4"], tokenizer="bytes"), store) as server:
...     ro = store.start_rollout("2+2?")
...     server.llm(ro.rollout_id).base_url.endswith(f"/rollout/{ro.rollout_id}/v1")
True
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from . import engines

if TYPE_CHECKING:
    from .llm import LLM
    from .server import PolicyServer
    from .settings import ServingSettings

_LAZY = {"LLM": ".llm", "PolicyServer": ".server", "ServingSettings": ".settings"}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = ["LLM", "PolicyServer", "ServingSettings", "engines"]
