"""Where a step's rollouts run, behind one small interface, and the server they talk to.

A :class:`RolloutSource` serves the policy (it starts the PolicyServer the agents call), runs a
list of rollouts to their outcomes and stops. :class:`InProcessRollouts` runs the agent in threads
of this process (the default); ``agl.RemoteRunners`` and ``agl.RayRunners`` (in
:mod:`agentlightning_lite.remote`) queue them for runner processes. The trainer is given one
(``Trainer(runners=...)``) and knows nothing else about it: nothing here imports ``remote``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from ..tracer import Tracer
from .config import RolloutConfig
from .rollouts import RolloutResult, RolloutSpec, run_rollouts

__all__ = ["CancellableSource", "InProcessRollouts", "RolloutSource", "Serving"]


@runtime_checkable
class RolloutSource(Protocol):
    """Runs rollouts for the trainer: ``serve`` once, ``collect`` every step, ``stop`` at the end."""

    def serve(
        self,
        engine: ServingEngine,
        store: Store,
        rollout_timeout: float | None = None,
        server_options: dict[str, Any] | None = None,
    ) -> Any:
        """Start the PolicyServer the agents call (with whatever routes this source needs); return it."""

    def collect(
        self, agent: Any, specs: Sequence[RolloutSpec], progress: Callable[[], None] | None = None
    ) -> list[RolloutResult]:
        """Run one rollout per spec; one result per spec, in order. ``progress()`` after each one ends."""

    def stop(self) -> None:
        """Stop what :meth:`serve` and :meth:`collect` started (the caller stops the server)."""


@runtime_checkable
class CancellableSource(Protocol):
    """A rollout source that can give up the rollouts its collects are running (``InProcessRollouts``)."""

    def cancel(self) -> None:
        """Every :meth:`~RolloutSource.collect` in progress gives up its unfinished rollouts (marked
        ``failed`` in the store, their engine requests cancelled) and returns at once."""


class InProcessRollouts:
    """Rollouts in threads of this process, each agent calling the server through ``server.llm(rollout_id)``.

    ``config`` is read at every :meth:`collect` (``concurrency``, ``timeout``): changing it on a running
    trainer takes effect from the next step. A rollout past its timeout has its engine requests cancelled.
    :meth:`cancel` gives up the rollouts of every collect in progress (a :class:`CancellableSource`).
    """

    def __init__(self, tracer: Tracer, config: RolloutConfig, default_concurrency: int = 8) -> None:
        self.tracer = tracer
        self.config = config
        self.default_concurrency = default_concurrency
        self.server: Any = None
        self._collecting: set[threading.Event] = set()
        self._lock = threading.Lock()

    def serve(
        self,
        engine: ServingEngine,
        store: Store,
        rollout_timeout: float | None = None,
        server_options: dict[str, Any] | None = None,
    ) -> Any:
        from ..serving import PolicyServer

        self.server = PolicyServer(engine, store, **(server_options or {})).start()
        return self.server

    def collect(
        self, agent: Any, specs: Sequence[RolloutSpec], progress: Callable[[], None] | None = None
    ) -> list[RolloutResult]:
        if self.server is None:
            raise RuntimeError("InProcessRollouts.collect() before serve()")
        server, cancelled = self.server, threading.Event()
        with self._lock:
            self._collecting.add(cancelled)
        try:
            return run_rollouts(
                agent,
                specs,
                self.tracer,
                _with_timeout(server.llm, self.config.timeout_s),
                concurrency=self.config.concurrency or self.default_concurrency,
                timeout=self.config.timeout_s,
                on_done=(lambda _r: progress()) if progress is not None else None,
                on_timeout=server.cancel_rollout,
                describe=getattr(server, "running_replies", None),
                cancel=cancelled,
            )
        finally:
            with self._lock:
                self._collecting.discard(cancelled)

    def cancel(self) -> None:
        with self._lock:
            for event in self._collecting:
                event.set()

    def stop(self) -> None:
        self.server = None


class Serving:
    """The trainer's server while ``fit``, ``train_step`` or ``evaluate`` runs.

    The outermost :meth:`session` starts it through the source and stops it on the way out; nested
    sessions (a step inside ``fit``) reuse it.
    """

    def __init__(
        self,
        source: RolloutSource,
        engine: ServingEngine,
        store: Store,
        config: RolloutConfig,
        server_options: dict[str, Any],
    ) -> None:
        self.source = source
        self.engine = engine
        self.store = store
        self.config = config
        self.server_options = server_options
        self.server: Any = None

    @contextlib.contextmanager
    def session(self) -> Iterator[Any]:
        if self.server is not None:
            yield self.server
            return
        self.server = self.source.serve(self.engine, self.store, self.config.timeout_s, self.server_options)
        try:
            yield self.server
        finally:
            try:
                self.source.stop()  # workers the source started stop before the server
            finally:
                server, self.server = self.server, None
                if server is not None:
                    server.stop()


def _with_timeout(llm_for: Callable[..., Any], timeout: float | None) -> Callable[..., Any]:
    """``llm_for`` whose endpoints carry the rollout's time limit (``LLM.timeout``), so an agent's client
    made from one waits as long as the rollout may run, not its SDK's shorter default."""
    if timeout is None:
        return llm_for

    def llm(rollout_id: str, *args: Any, **kwargs: Any) -> Any:
        return llm_for(rollout_id, *args, **kwargs).model_copy(update={"timeout": timeout})

    return llm
