"""Environments from the hubs: tasks, tools and the reward from reasoning-gym, NeMo Gym, TextArena,
OpenEnv or verifiers.

An environment's default agent plays its tasks against the PolicyServer like any agent, so
``trainer.fit(env.agent, env.tasks)`` trains on it with every algorithm, and
``trainer.evaluate(env.agent, env.tasks)`` measures it (docs/environments.md).

>>> import agentlightning_lite as agl
>>> env = agl.envs.ReasoningGym("basic_arithmetic", size=2, seed=0)
>>> len(env.tasks)
2
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr
from .base import EnvAgent, Environment
from .spec import make

if TYPE_CHECKING:
    from .nemo_gym import NemoGym
    from .openenv import OpenEnv
    from .reasoning_gym import ReasoningGym
    from .textarena import TextArena
    from .verifiers import Verifiers

__all__ = ["EnvAgent", "Environment", "NemoGym", "OpenEnv", "ReasoningGym", "TextArena", "Verifiers", "make"]

__getattr__ = lazy_getattr(
    __name__,
    {
        "ReasoningGym": ".reasoning_gym",
        "NemoGym": ".nemo_gym",
        "TextArena": ".textarena",
        "OpenEnv": ".openenv",
        "Verifiers": ".verifiers",
    },
)
