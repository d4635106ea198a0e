"""What the rest of the package may ask of an engine: a few small protocols.

:class:`ServingEngine` is what every engine does (the PolicyServer needs nothing more): turn
chat messages into prompt token ids and back, generate (blocking, or one request as a future that
can be cancelled), pause for a weight switch (new requests wait, the ones in flight finish), say
which response formats it can enforce, count its weight ``version``, close.
:class:`TrainableEngine` adds :meth:`~TrainableEngine.update_weights`: it takes new weights and is
the only one that changes its ``version`` (callers read it, never write it).
:class:`InPlaceEngine` is a trainable engine whose module *is* the training model (``HFEngine``):
the trainer updates ``model`` inside ``update_weights(fn)``, under the engine's lock.
:class:`MultiAdapterEngine` serves several LoRA adapters on one base model, one per agent;
:class:`AdapterRemovingEngine` can also take one out again (``HFEngine``, ``HTTPEngine``/``VLLMEngine``).
:class:`BatchLimitedEngine` decodes at most ``max_batch_size`` requests together (``HFEngine``).
:class:`BackendError` is what an engine raises when the inference server behind it fails a request.

The protocols are checked at runtime with ``isinstance`` (attribute presence, not signatures):

>>> from agentlightning_lite.serving.engines import ScriptedEngine
>>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
>>> isinstance(engine, ServingEngine), isinstance(engine, TrainableEngine)
(True, False)
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, Union, runtime_checkable

from ..structured import ResponseFormat
from .base import GenRequest, GenResult, RunningRequest

__all__ = [
    "AdapterRemovingEngine",
    "BackendError",
    "BatchLimitedEngine",
    "InPlaceEngine",
    "MultiAdapterEngine",
    "ServingEngine",
    "TrainableEngine",
    "WeightSource",
]

#: What :meth:`TrainableEngine.update_weights` accepts: a state dict, an adapter directory, or (engines
#: that train in place) a function run on the engine's own model under its lock.
WeightSource = Union[Mapping[str, Any], str, "os.PathLike[str]", Callable[[Any], Any]]


class BackendError(RuntimeError):
    """An inference server failed a request: unreachable, dead, or it answered with an error
    (``status``: its HTTP status, ``None`` when it did not answer; ``path``: the route asked; ``reason``:
    the server's own words, when it answered with an error).

    Engines that serve through inference servers (``HTTPEngine``, ``VLLMEngine``) raise it; the
    PolicyServer answers a generation it failed with the server's 400/413/422, or a 502.

    >>> err = BackendError("inference server http://h:8000 answered 400", status=400, path="/v1/completions")
    >>> isinstance(err, RuntimeError), err.status, err.path
    (True, 400, '/v1/completions')
    """

    def __init__(
        self, message: str, status: int | None = None, path: str | None = None, reason: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.path = path
        self.reason = reason


@runtime_checkable
class ServingEngine(Protocol):
    """What every engine does; the PolicyServer, the runners and the trainer's rollouts need no more."""

    model_name: str
    max_context: int
    lock: threading.RLock

    @property
    def version(self) -> int:
        """How many weight updates the engine has taken (read-only for callers)."""

    def apply_chat_template(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[Any] | None = None,
        tool_choice: Any = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text of chat ``messages``; ``template_kwargs``: extra chat-template variables."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...

    def token_text(self, token_id: int) -> str: ...

    @property
    def vocab_size(self) -> int | None: ...

    @property
    def chat_template(self) -> str | None:
        """The tokenizer's chat template text (``None``: none)."""

    def check_response_format(
        self, fmt: ResponseFormat, tools: Sequence[dict[str, Any]] | None = None
    ) -> None: ...

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]: ...

    def submit(self, request: GenRequest) -> concurrent.futures.Future[GenResult]: ...

    def cancel(self, future: concurrent.futures.Future[GenResult]) -> bool: ...

    def pause(self) -> None:
        """Hold new requests (they start at :meth:`resume`); return once none is in flight."""

    def resume(self) -> None:
        """End a :meth:`pause`: the held requests go on."""

    def paused(self) -> AbstractContextManager[None]:
        """``pause()`` ... ``resume()`` as a context: no request generates inside (a weight switch)."""

    def expect(self, n: int, wait_s: float = 2.0) -> None:
        """A hint that ``n`` requests are about to arrive together (batching engines wait for them)."""

    @property
    def adapters(self) -> list[str]: ...

    def set_routes(self, routes: Mapping[str, str | None], default: str | None = None) -> None: ...

    def adapter_for(self, agent: str | None) -> str | None: ...

    def close(self) -> None: ...

    def running(self) -> list[RunningRequest]:
        """The requests generating now (what a timed-out rollout's error names)."""
        ...

    @property
    def stats(self) -> dict[str, Any]:
        """Work counters (``requests``, ``generated_tokens``; the HF engine also ``prefill_tokens``,
        ``decode_tokens``, ``prefix_cache_hits``...)."""
        ...


@runtime_checkable
class TrainableEngine(ServingEngine, Protocol):
    """An engine that takes new weights (``HFEngine``, ``VLLMEngine``)."""

    def update_weights(self, source: WeightSource, adapter: str | None = None) -> int:
        """Load ``source`` (into adapter ``adapter``; default: the engine's own), bump ``version``
        under ``lock`` and return it."""


@runtime_checkable
class InPlaceEngine(TrainableEngine, Protocol):
    """A trainable engine whose ``model`` is the module the optimiser updates (``HFEngine``).

    ``update_weights(fn)`` runs ``fn(model)`` under the engine's lock (no generation meanwhile).
    ``pad_token_id`` pads training batches; ``autocast_dtype`` (``None``: off) is the precision the
    engine computes in, which the update uses too.
    """

    model: Any
    pad_token_id: int
    autocast_dtype: Any


@runtime_checkable
class MultiAdapterEngine(ServingEngine, Protocol):
    """An engine that can add LoRA adapters next to its others and route each agent to one."""

    def add_adapter(
        self, name: str, lora: Any, trainable: bool | None = None, named_only: bool = False
    ) -> None:
        """Add adapter ``name``: LoRA settings (a fresh, trainable adapter) or a saved adapter's
        directory (loaded frozen unless ``trainable=True``). ``named_only``: it serves only requests
        that name it (``GenRequest.adapter``), never an agent by default (how the PolicyServer's
        ``/v1/load_lora_adapter`` adds one)."""


@runtime_checkable
class AdapterRemovingEngine(MultiAdapterEngine, Protocol):
    """A multi-adapter engine that can also remove an adapter (``HFEngine``, ``HTTPEngine``)."""

    def remove_adapter(self, name: str) -> None:
        """Remove adapter ``name`` (``KeyError`` when the engine has no such adapter)."""


@runtime_checkable
class BatchLimitedEngine(Protocol):
    """An engine that decodes at most ``max_batch_size`` requests together; more wait their turn
    (the engines of :class:`~.batching.BatchingEngine`: ``HFEngine``)."""

    max_batch_size: int
