"""Training on the agent's own runs: GRPO, PPO and SFT on LoRA weights, with ``Trainer``."""

from .grpo import GRPO
from .lora import LoRA
from .ppo import PPO
from .rollouts import LitAgent
from .sft import SFT
from .trainer import Trainer

__all__ = ["GRPO", "PPO", "SFT", "LitAgent", "LoRA", "Trainer"]
