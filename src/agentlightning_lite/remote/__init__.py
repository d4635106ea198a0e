"""Disaggregated training: agents run in runner processes anywhere and stream their runs to the trainer.

On the trainer, ``agl.Trainer(..., runners=agl.RemoteRunners(...))`` queues each step's rollouts
on the server's port; on each agent machine ``agl-lite runner module:agent --server URL`` (or
:class:`Runner`) claims them, runs the agent and sends its spans back (:class:`RemoteStore`);
``agl.RayRunners(num_workers=...)`` starts the same runners as Ray actors. Agents in other
languages speak the same HTTP routes and send their spans with any OTLP/HTTP exporter.

The runner side (:class:`Runner`, :class:`RunnerClient`, :class:`RemoteStore`) imports without the
server's web stack (starlette, uvicorn), so an agent machine needs only httpx; :class:`RemoteRunners`
and :class:`RayRunners`, which serve the queue, load it on first use.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from .client import RemoteError, RunnerClient
from .queue import RolloutQueue
from .remote_store import RemoteStore
from .worker import Runner, load_agent

if TYPE_CHECKING:
    from .ray_runners import RayRunners
    from .runners import RemoteRunners

_LAZY = {"RayRunners": ".ray_runners", "RemoteRunners": ".runners"}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "RayRunners",
    "RemoteError",
    "RemoteRunners",
    "RemoteStore",
    "RolloutQueue",
    "Runner",
    "RunnerClient",
    "load_agent",
]
