"""Training on the agent's own runs: GRPO, PPO and SFT on LoRA weights, with ``Trainer``.

The names load on first use, so ``agentlightning_lite.rl.rollouts`` (the agent-calling side, used by
remote runners) is importable without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_getattr

if TYPE_CHECKING:
    from ..lora_settings import LoRA
    from .grpo import GRPO
    from .ppo import PPO
    from .rollouts import LitAgent
    from .sft import SFT
    from .trainer import Trainer

__all__ = ["GRPO", "PPO", "SFT", "LitAgent", "LoRA", "Trainer"]

_WHERE = {
    "GRPO": ".grpo",
    "PPO": ".ppo",
    "SFT": ".sft",
    "LitAgent": ".rollouts",
    "LoRA": "..lora_settings",
    "Trainer": ".trainer",
}


__getattr__ = lazy_getattr(__name__, _WHERE)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
