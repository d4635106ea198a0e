"""Prompt optimisation: ``agl.prompt`` for the text an agent reads, ``agl.APO`` to optimise it with GEPA.

``agl.prompt`` needs nothing but the tracer; ``agl.APO`` needs the ``gepa`` package
(``pip install 'agentlightning-lite[apo]'``) when it runs.
"""

from typing import Any

from ..prompts import component_key, load_prompts, prompt, save_prompts, with_prompts


def __getattr__(name: str) -> Any:  # APO imports the rollout machinery: load it on first use
    if name in ("APO", "candidate_id"):
        from . import optimizer

        return getattr(optimizer, name)
    if name == "ReflectionLM":
        from .reflection import ReflectionLM

        return ReflectionLM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "APO",
    "ReflectionLM",
    "candidate_id",
    "component_key",
    "load_prompts",
    "prompt",
    "save_prompts",
    "with_prompts",
]
