"""Reinforcement learning on the agent's own runs: GRPO and PPO on LoRA weights, with ``Trainer``."""

from .grpo import GRPO
from .lora import LoRA
from .ppo import PPO
from .rollouts import LitAgent
from .trainer import Trainer

__all__ = ["GRPO", "PPO", "LitAgent", "LoRA", "Trainer"]
