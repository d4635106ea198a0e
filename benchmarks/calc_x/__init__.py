"""Calc-X (the Agent Lightning paper's math task): an AutoGen agent with a calculator, trained with GRPO.

    python -m benchmarks.calc_x --data-dir /work/shared/data        # CPU defaults, SmolLM2-135M
    agl-lite train calc_x --data-dir /work/shared/data              # the same agent through the CLI

``agent`` is the training agent ``(task, llm) -> reward`` and ``load_dataset(split, data_dir=None)`` the
data; see ``README.md`` for the reward, the AIR shaping, the data split and the GPU command.
"""

from .autogen_agent import AIR, CREDIT, agent, make_agent
from .data import load_dataset

__all__ = ["AIR", "CREDIT", "agent", "load_dataset", "make_agent"]
