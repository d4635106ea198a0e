"""``agl.RemoteRunners``: the trainer's side of disaggregated training (a queue on the server's port).

Pass it as ``Trainer(runners=agl.RemoteRunners(...))`` (it is a rollout source: ``serve``, ``collect``,
``stop``): the trainer's PolicyServer then listens on
``host:port`` with the runner routes next to ``/v1``, each step's rollouts are queued for the
runners (``agl-lite runner module:agent --server URL``) instead of run as threads, and the step
goes on once every rollout has its one outcome (see :mod:`agentlightning_lite.remote.queue`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..rl.rollouts import RolloutResult, RolloutSpec
from ..serving.engines.contract import ServingEngine
from ..store.base import Store
from .queue import Job, RolloutQueue
from .routes import remote_routes

__all__ = ["RemoteRunners"]

logger = logging.getLogger(__name__)


class RemoteRunners:
    """Rollouts run by runner processes anywhere on the network, not by threads of the trainer.

    Args:
        host: address the trainer's server binds (``"0.0.0.0"`` to accept other machines;
            set an ``api_key`` then).
        port: its port (``0`` picks a free one; see ``url`` once the trainer serves).
        api_key: required from runners and agents as ``Authorization: Bearer <key>`` on every
            endpoint (queue, spans, OTLP, the OpenAI API).
        lease_timeout: seconds without a heartbeat after which a claimed rollout counts as lost.
        max_attempts: attempts per rollout (lost ones are retried on another runner); after the
            last the rollout is ``failed``.
        max_body_bytes: the largest request body accepted (413 beyond).
        advertise_url: the URL workers started by the trainer (Ray actors) connect to
            (default: ``http://host:port``, with this machine's name when ``host`` is 0.0.0.0).

    >>> import agentlightning_lite as agl
    >>> runners = agl.RemoteRunners(port=8765, api_key="secret", max_attempts=2)
    >>> runners.host, runners.lease_timeout
    ('127.0.0.1', 30.0)
    >>> trainer = agl.Trainer(model="smollm2-135m", runners=runners)  # doctest: +SKIP
    >>> trainer.fit("my_agent", tasks, steps=100)  # doctest: +SKIP
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        api_key: str | None = None,
        lease_timeout: float = 30.0,
        max_attempts: int = 3,
        max_body_bytes: int = 32 * 2**20,
        advertise_url: str | None = None,
    ) -> None:
        if lease_timeout <= 0:
            raise ValueError(f"lease_timeout must be > 0, got {lease_timeout}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.host = host
        self.port = port
        self.api_key = api_key
        self.lease_timeout = float(lease_timeout)
        self.max_attempts = int(max_attempts)
        self.max_body_bytes = int(max_body_bytes)
        self.advertise_url = advertise_url
        self.queue: RolloutQueue | None = None
        self.server: Any = None
        self._starting = threading.Lock()  # asynchronous training collects from several threads
        if host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
            logger.warning(
                "RemoteRunners on %s without an api_key: anyone who reaches the port can use it", host
            )

    # -- serving --------------------------------------------------------------------------------
    def serve(
        self,
        engine: ServingEngine,
        store: Store,
        rollout_timeout: float | None = None,
        server_options: dict[str, Any] | None = None,
    ) -> Any:
        """Start the PolicyServer with the runner routes; returns the started server."""
        from ..serving.server import PolicyServer

        runners = self

        class QueueServer(PolicyServer):
            """The PolicyServer with the runner routes beside the OpenAI ones."""

            def extra_routes(self) -> list[Any]:
                assert runners.queue is not None
                return remote_routes(self, runners.queue)

        options = {
            "host": self.host,
            "port": self.port,
            "api_key": self.api_key,
            "max_body_bytes": self.max_body_bytes,
            **(server_options or {}),
        }
        self.queue = RolloutQueue(
            store,
            lease_timeout=self.lease_timeout,
            max_attempts=self.max_attempts,
            rollout_timeout=rollout_timeout,
            version=lambda: int(engine.version),
        )
        server = QueueServer(engine, store, **options)
        self.server = server.start()
        logger.info("waiting for runners at %s (agl-lite runner AGENT --server %s)", server.url, self.url)
        return server

    @property
    def url(self) -> str:
        """Where runners connect: ``advertise_url``, else the server's URL."""
        if self.advertise_url:
            return self.advertise_url.rstrip("/")
        if self.server is None:
            raise RuntimeError("the trainer is not serving yet")
        if self.host in ("0.0.0.0", "::"):
            import socket

            return f"http://{socket.gethostname()}:{self.server.port}"
        return str(self.server.url)

    def start_workers(self, agent: Any) -> None:
        """Start workers the trainer owns (none here: runners are started on their own machines)."""

    def stop(self) -> None:
        """Stop the workers the trainer started and close the queue (the trainer stops the server)."""
        if self.queue is not None:
            self.queue.close()
        self.queue = None
        self.server = None

    # -- running a step -------------------------------------------------------------------------
    def collect(
        self, agent: Any, specs: Sequence[RolloutSpec], progress: Callable[[], None] | None = None
    ) -> list[RolloutResult]:
        """The trainer's side of a step (``agentlightning_lite.rl.sources.RolloutSource``): start the
        workers the trainer owns, queue one rollout per spec and wait; one result per spec, in order
        (a rollout no runner took has no ``rollout_id``). Safe to call from several threads at once
        (asynchronous training runs a step ahead): each call waits for its own rollouts."""
        with self._starting:
            self.start_workers(agent)
        jobs = self.run(
            [(s.task, s.mode, s.metadata) for s in specs],
            on_done=(lambda _j: progress()) if progress is not None else None,
        )
        now = time.monotonic()
        return [
            RolloutResult(
                j.rollout_id or "",
                s,
                j.status or "failed",
                j.reward,
                j.error,
                (j.finished_at or now) - (j.started_at or j.queued_at),
            )
            for s, j in zip(specs, jobs, strict=True)
        ]

    def run(
        self,
        specs: Sequence[tuple[Any, str, dict[str, Any]]],
        on_done: Callable[[Job], None] | None = None,
    ) -> list[Job]:
        """Queue ``(task, mode, metadata)`` rollouts and wait until each has its one outcome."""
        if self.queue is None:
            raise RuntimeError("RemoteRunners.run() before serve()")
        t0 = time.monotonic()
        jobs = self.queue.submit(specs)
        try:
            self.queue.wait(jobs, on_done=on_done)
        except BaseException:
            self.queue.cancel(jobs, "the trainer stopped waiting")
            raise
        store = self.queue.store
        for j in jobs:  # a reward recorded on its own (not with the result) counts as well
            if j.status == "succeeded" and j.reward is None and j.rollout_id is not None:
                ro = store.get_rollout(j.rollout_id)
                j.reward = None if ro is None else ro.reward
        logger.debug("%d remote rollouts in %.2f s", len(jobs), time.monotonic() - t0)
        return jobs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(host={self.host!r}, port={self.port})"
