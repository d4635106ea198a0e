"""agentlightning-lite: turn the runs of an existing LLM agent into RL data and train its policy.

>>> import agentlightning_lite as agl
>>> tracer = agl.Tracer(agl.MemoryStore())
>>> with tracer.rollout("What is 2+2?") as ro:
...     with tracer.span("llm", "chat", input="What is 2+2?") as sp:
...         sp.set_output("4")
...     ro.reward(1.0)
>>> [t.reward for t in agl.transitions(tracer.store)]
[1.0]
"""

from . import air, credit, otel
from .rl import GRPO, PPO, LitAgent, LoRA, Trainer
from .sft import export_sft
from .store import MemoryStore, SQLiteStore, Store
from .tracer import Tracer, emit_reward, emit_signal
from .transitions import transitions
from .types import Rollout, Span, Transition

__version__ = "0.1.0"

__all__ = [
    "GRPO",
    "PPO",
    "LitAgent",
    "LoRA",
    "Trainer",
    "MemoryStore",
    "Rollout",
    "SQLiteStore",
    "Span",
    "Store",
    "Tracer",
    "Transition",
    "__version__",
    "air",
    "credit",
    "emit_reward",
    "emit_signal",
    "export_sft",
    "otel",
    "transitions",
]
