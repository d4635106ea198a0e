"""Training on the agent's own runs: GRPO, PPO and SFT on LoRA weights, with ``Trainer``, which
composes a ``Rollouts`` session (the rollout side) and a ``Learner`` (the update side).

The names load on first use, so ``agentlightning_lite.rl.rollouts`` (the agent-calling side, used by
remote runners) is importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from ..lora_settings import LoRA
    from .algorithm import Algorithm, RolloutOnly, WeightUpdate
    from .grpo import GRPO
    from .learner import Learner
    from .ppo import PPO
    from .rollouts import LitAgent
    from .session import RolloutBatch, Rollouts
    from .sft import SFT
    from .trainer import Trainer

__all__ = [
    "GRPO",
    "PPO",
    "SFT",
    "Algorithm",
    "Learner",
    "LitAgent",
    "LoRA",
    "RolloutBatch",
    "RolloutOnly",
    "Rollouts",
    "Trainer",
    "WeightUpdate",
]

_WHERE = {
    "GRPO": ".grpo",
    "PPO": ".ppo",
    "SFT": ".sft",
    "LitAgent": ".rollouts",
    "LoRA": "..lora_settings",
    "Trainer": ".trainer",
    "Algorithm": ".algorithm",
    "WeightUpdate": ".algorithm",
    "RolloutOnly": ".algorithm",
    "Learner": ".learner",
    "Rollouts": ".session",
    "RolloutBatch": ".session",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
