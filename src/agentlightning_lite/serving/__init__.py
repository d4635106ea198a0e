"""Policy serving: an OpenAI-compatible server that records every call with exact tokens, and its engines.

>>> import agentlightning_lite as agl
>>> from agentlightning_lite.serving import PolicyServer, engines
>>> store = agl.MemoryStore()
>>> with PolicyServer(engines.ScriptedEngine(["4"], tokenizer="bytes"), store) as server:
...     ro = store.start_rollout("2+2?")
...     server.llm(ro.rollout_id).base_url.endswith(f"/rollout/{ro.rollout_id}/v1")
True
"""

from . import engines
from .llm import LLM
from .server import PolicyServer

__all__ = ["LLM", "PolicyServer", "engines"]
