"""``agl.RayRunners``: the trainer starts its runners as Ray actors on a Ray cluster (or a local one).

Each actor runs a :class:`~agentlightning_lite.remote.Runner` (``workers_per_actor`` rollouts at a
time) that connects back to the trainer over HTTP, exactly as ``agl-lite runner`` does; the actors
are started when training starts and killed when it ends. Needs ``pip install 'agentlightning-lite[ray]'``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from .runners import RemoteRunners

__all__ = ["RayRunners"]

logger = logging.getLogger(__name__)


class _RunnerActor:
    """The body of one Ray actor: a Runner in the actor's process."""

    def __init__(self, agent: Any, url: str, api_key: str | None, workers: int, worker_id: str) -> None:
        import logging as _logging

        from .worker import Runner

        _logging.basicConfig(level=_logging.INFO)
        self.runner = Runner(
            agent, url, api_key=api_key, workers=workers, worker_id=worker_id, claim_wait=2.0
        )

    def start(self) -> str:
        self.runner.start()
        return self.runner.worker_id

    def stats(self) -> dict[str, int]:
        return {"completed": self.runner.completed, "counted": self.runner.counted}

    def stop(self) -> dict[str, int]:
        self.runner.stop(timeout=10.0)
        return self.stats()


class RayRunners(RemoteRunners):
    """Runners started by the trainer as Ray actors: scale rollouts out over a Ray cluster.

    Args:
        num_workers: rollouts run at once, in all.
        agent: what the actors run: ``"module:attribute"`` (imported in each actor) or the agent
            itself (shipped to the actors by Ray); default: the agent given to ``fit``.
        workers_per_actor: rollouts at a time per actor (threads); ``num_workers /
            workers_per_actor`` actors are started.
        address: the Ray cluster to join (``"auto"``, ``"ray://head:10001"``); default: the
            running one, else a local one (``ray.init()``).
        init_options: more keyword arguments for ``ray.init`` (e.g. ``{"num_cpus": 2}``).
        actor_options: Ray options of each actor (``{"num_cpus": 1, "resources": ...}``).
        host, port, api_key, lease_timeout, max_attempts, max_body_bytes, advertise_url: as for
            :class:`RemoteRunners` (on a multi-machine cluster bind ``host="0.0.0.0"`` and
            set an ``api_key``).

    >>> import agentlightning_lite as agl
    >>> runners = agl.RayRunners(num_workers=8, workers_per_actor=4, agent="my_agent:agent")
    >>> runners.num_actors
    2
    >>> agl.Trainer(model="smollm2-135m", runners=runners).fit("my_agent", tasks)  # doctest: +SKIP
    """

    def __init__(
        self,
        num_workers: int = 4,
        agent: Any = None,
        workers_per_actor: int = 1,
        address: str | None = None,
        init_options: dict[str, Any] | None = None,
        actor_options: dict[str, Any] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        lease_timeout: float = 30.0,
        max_attempts: int = 3,
        max_body_bytes: int = 32 * 2**20,
        advertise_url: str | None = None,
    ) -> None:
        super().__init__(host, port, api_key, lease_timeout, max_attempts, max_body_bytes, advertise_url)
        if num_workers < 1 or workers_per_actor < 1:
            raise ValueError("num_workers and workers_per_actor must be >= 1")
        self.num_workers = num_workers
        self.agent = agent
        self.workers_per_actor = workers_per_actor
        self.address = address
        self.init_options = dict(init_options or {})
        self.actor_options = dict(actor_options or {})
        self.actors: list[Any] = []

    @property
    def num_actors(self) -> int:
        """How many actors are started."""
        return math.ceil(self.num_workers / self.workers_per_actor)

    def start_workers(self, agent: Any) -> None:
        """Start the actors (once per training run); they connect to :attr:`url`."""
        if self.actors:
            return
        try:
            import ray
        except ImportError:
            raise ImportError("RayRunners needs Ray: pip install 'agentlightning-lite[ray]'") from None
        target = self.agent if self.agent is not None else agent
        if target is None:
            raise ValueError("RayRunners needs an agent: RayRunners(agent='module:attr') or fit(agent, ...)")
        if not ray.is_initialized():
            ray.init(address=self.address, **self.init_options)
        actor_cls = ray.remote(_RunnerActor)
        url = self.url
        left = self.num_workers
        for i in range(self.num_actors):
            n = min(self.workers_per_actor, left)
            left -= n
            actor = actor_cls.options(**self.actor_options).remote(
                target, url, self.api_key, n, f"ray-actor-{i}"
            )
            self.actors.append(actor)
        ids = ray.get([a.start.remote() for a in self.actors])
        logger.info("started %d Ray runner actors (%s) for %s", len(ids), ", ".join(ids), url)

    def stop(self) -> None:
        """Stop and kill the actors."""
        if self.actors:
            import ray

            try:
                ray.get([a.stop.remote() for a in self.actors], timeout=30)
            except Exception as exc:  # an actor that does not stop in time is killed anyway
                logger.warning("Ray runner actors did not stop cleanly: %s", exc)
            for a in self.actors:
                ray.kill(a)
            self.actors = []
        super().stop()
