"""An environment named by a ``KIND:NAME`` string (what ``agl-lite train --env`` takes)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .base import Environment

__all__ = ["KINDS", "make"]

#: the kinds :func:`make` knows, each with an example ``KIND:NAME``
KINDS = {
    "reasoning_gym": "reasoning_gym:basic_arithmetic",
    "nemo_gym": "nemo_gym:http://127.0.0.1:8000",
    "textarena": "textarena:GuessTheNumber-v0",
    "openenv": "openenv:http://127.0.0.1:8000",
    "verifiers": "verifiers:my_tasks.py:load_taskset",
}


def make(
    spec: str, size: int = 100, seed: int = 0, data: str | Path | None = None, **options: Any
) -> Environment:
    """The environment ``spec`` names: ``reasoning_gym:<dataset>``, ``nemo_gym:<base url>`` (its
    tasks from ``data``, a JSONL file of rows), ``textarena:<game>``, ``openenv:<base url>`` (an
    OpenEnv server; its tasks are ``reset`` arguments: the rows of ``data``, a JSONL file, else
    ``{"seed": s}``) or ``verifiers:<taskset>`` (``pkg.module:name``, ``path/file.py:name`` or
    verifiers' own taskset id); ``size`` tasks from ``seed`` (reasoning-gym and TextArena: the
    generator's seed; OpenEnv without ``data``: seeds; verifiers: a shuffle of the taskset).
    ``options`` go to the environment's constructor.

    >>> env = make("reasoning_gym:basic_arithmetic", size=3, seed=5)
    >>> env
    ReasoningGym('basic_arithmetic', size=3, seed=5)
    >>> make("gym:CartPole")
    Traceback (most recent call last):
    ...
    ValueError: unknown environment kind 'gym' in 'gym:CartPole': one of reasoning_gym, ..., verifiers
    """
    kind, sep, name = spec.partition(":")
    kind = kind.strip().lower().replace("-", "_")
    if not sep or not name:
        raise ValueError(f"an environment is KIND:NAME (e.g. {', '.join(KINDS.values())}), got {spec!r}")
    if kind == "reasoning_gym":
        from .reasoning_gym import ReasoningGym

        return ReasoningGym(name, size=size, seed=seed, **options)
    if kind == "textarena":
        from .textarena import TextArena

        return TextArena(name, size=size, seed=seed, **options)
    if kind == "verifiers":
        from .verifiers import Verifiers

        return Verifiers(name, size=size, seed=seed, **options)
    if kind == "nemo_gym":
        from .nemo_gym import NemoGym

        if data is None:
            raise ValueError(f"{spec}: NeMo Gym tasks are dataset rows: give them (a JSONL file) as data")
        return NemoGym(name, data=data, **options)
    if kind == "openenv":
        from .openenv import OpenEnv

        if data is not None:
            lines = Path(data).read_text(encoding="utf-8").splitlines()
            options = {**options, "tasks": [json.loads(line) for line in lines if line.strip()]}
        return OpenEnv(name, size=size, seed=seed, **options)
    raise ValueError(f"unknown environment kind {kind!r} in {spec!r}: one of {', '.join(KINDS)}")
