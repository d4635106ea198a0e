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
    from .doctor import Finding, diagnose
    from .doctor_report import Report, diagnose_run
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
    "Finding",
    "Learner",
    "LitAgent",
    "LoRA",
    "Report",
    "RolloutBatch",
    "RolloutOnly",
    "Rollouts",
    "Trainer",
    "WeightUpdate",
    "diagnose",
    "diagnose_run",
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
    "Finding": ".doctor",
    "diagnose": ".doctor",
    "Report": ".doctor_report",
    "diagnose_run": ".doctor_report",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
