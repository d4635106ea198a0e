"""What the routes need of the server that mounts them: settings, the engine, the store, the serving
state and how replies are read. :class:`~.server.PolicyServer` is one; the routes depend on this
protocol alone (they never import the server, nor read its private members)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from ..store.base import Store
from .engines.contract import ServingEngine
from .reply import ReplyParser
from .settings import ServingSettings
from .state import RecentDict, RolloutState

__all__ = ["ServingContext"]


class ServingContext(Protocol):
    """The server as its routes see it."""

    engine: ServingEngine
    store: Store
    #: the key, the limits, what a training rollout's truncated sampling gets... (read-only)
    settings: ServingSettings
    #: the name the server answers with; ``served_names``: every name a request may ask for
    model_name: str
    served_names: set[str]
    #: per-rollout state: known rollouts, modes, requests in flight, cancellations, keys, warnings
    rollouts: RolloutState
    #: Responses API: the conversations kept for ``previous_response_id``
    responses: RecentDict[list[dict[str, Any]]]
    #: how the served model writes tool calls (and reasoning) in its replies
    reply_parser: ReplyParser
    #: the reply parser's markers that are special tokens of the served tokenizer (id -> text), kept
    #: when a reply is decoded (empty: read the plain decode)
    reply_markers: dict[int, str]
    rollout_guard: Callable[[str, list[str]], None] | None
    lora_adapters: dict[str, str]
    lora_lock: asyncio.Lock

    def rollout_key(self, rollout_id: str) -> str: ...

    def clamps(self, api: str) -> bool: ...

    def lora_adapter_of(self, body: dict[str, Any]) -> str | None: ...
