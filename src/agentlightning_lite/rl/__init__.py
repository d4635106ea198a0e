"""Training on the agent's own runs: GRPO, PPO and SFT on LoRA weights, with ``Trainer``.

The names load on first use, so ``agentlightning_lite.rl.rollouts`` (the agent-calling side, used by
remote runners) is importable without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .grpo import GRPO
    from .lora import LoRA
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
    "LoRA": ".lora",
    "Trainer": ".trainer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(_WHERE[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
