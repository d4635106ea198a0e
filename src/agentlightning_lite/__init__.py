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

from typing import TYPE_CHECKING, Any

from . import air, credit, otel
from .prompts import load_prompts, prompt
from .sft_export import export_sft
from .store import MemoryStore, SQLiteStore, Store
from .tracer import Tracer, emit_reward, emit_signal
from .transitions import transitions
from .types import Rollout, Span, Transition
from .version import __version__

# Serving (starlette, transformers) and training (torch, peft) load on first use, so tracing
# and the stores need nothing but pydantic.
_LAZY = {
    "APO": ".apo",
    "GRPO": ".rl",
    "PPO": ".rl",
    "LoRA": ".lora_settings",
    "SFT": ".rl",
    "LitAgent": ".agent",
    "CommandAgent": ".harness",
    "harness": ".harness",
    "Trainer": ".rl",
    "PolicyServer": ".serving",
    "ServingSettings": ".serving",
    "LLM": ".serving",
    "engines": ".serving",
    "envs": ".envs",
    "rewards": ".rewards",
    "models": ".models",
    "remote": ".remote",
    "RemoteRunners": ".remote",
    "RayRunners": ".remote",
    "TIS": ".rl.correction",
    "MaskedIS": ".rl.correction",
}

if TYPE_CHECKING:
    from . import envs, harness, models, remote, rewards
    from .agent import LitAgent
    from .apo import APO
    from .harness import CommandAgent
    from .lora_settings import LoRA
    from .remote import RayRunners, RemoteRunners
    from .rl import GRPO, PPO, SFT, Trainer
    from .rl.correction import TIS, MaskedIS
    from .serving import LLM, PolicyServer, ServingSettings, engines


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'agentlightning_lite' has no attribute {name!r}")
    import importlib

    module = importlib.import_module(_LAZY[name], __name__)
    value = module if name in ("models", "remote", "harness", "envs", "rewards") else getattr(module, name)
    globals()[name] = value
    return value


__all__ = [
    "APO",
    "CommandAgent",
    "GRPO",
    "LLM",
    "PPO",
    "LitAgent",
    "LoRA",
    "MaskedIS",
    "MemoryStore",
    "PolicyServer",
    "RayRunners",
    "RemoteRunners",
    "Rollout",
    "SFT",
    "SQLiteStore",
    "ServingSettings",
    "Span",
    "Store",
    "TIS",
    "Tracer",
    "Trainer",
    "Transition",
    "__version__",
    "air",
    "credit",
    "emit_reward",
    "emit_signal",
    "engines",
    "envs",
    "export_sft",
    "harness",
    "load_prompts",
    "models",
    "otel",
    "prompt",
    "remote",
    "rewards",
    "transitions",
]
