"""What every environment is: tasks, a default agent that plays them, a reward; the missing-extra error."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from ..agent import LitAgent

__all__ = ["EnvAgent", "Environment", "require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """Import ``module`` or raise an ``ImportError`` that names the extra to install.

    >>> require("json", "envs-none", "JSON").__name__
    'json'
    >>> require("no_such_module_here", "envs-x", "X")
    Traceback (most recent call last):
    ...
    ImportError: X needs the package no_such_module_here: pip install "agentlightning-lite[envs-x]"
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        line = f'pip install "agentlightning-lite[{extra}]"'
        raise ImportError(f"{what} needs the package {module}: {line}") from exc


class Environment:
    """Tasks, a default agent and a reward from one hub; ``trainer.fit(env.agent, env.tasks)`` trains on it.

    Subclasses set :attr:`tasks` (JSON-serialisable: the store records them) and implement
    :meth:`play`, which runs one task against ``llm`` and returns its reward. ``temperature`` is
    the sampling temperature of training rollouts; evaluation (``mode="val"``) samples with
    ``eval_temperature``. :attr:`max_rollout_tokens` is the most tokens one rollout generates, when
    the environment knows it (``None``: unknown); the trainer sizes its rollout timeout to it.

    >>> class Coin(Environment):
    ...     def play(self, task, llm, temperature):
    ...         return 1.0
    >>> env = Coin(tasks=[{"q": 1}])
    >>> env.agent(env.tasks[0], llm=None)
    1.0
    """

    def __init__(
        self, tasks: Sequence[Any] = (), temperature: float = 1.0, eval_temperature: float = 0.0
    ) -> None:
        self.tasks: list[Any] = list(tasks)
        self.temperature = temperature
        self.eval_temperature = eval_temperature

    @property
    def max_rollout_tokens(self) -> int | None:
        """The most tokens one rollout generates, when the environment knows it (``None``: unknown)."""
        return None

    @property
    def agent(self) -> EnvAgent:
        """The default agent: an :class:`agl.LitAgent` whose rollout is :meth:`play`."""
        return EnvAgent(self)

    def play(self, task: Any, llm: Any, temperature: float) -> float:
        raise NotImplementedError("an Environment implements play(task, llm, temperature)")

    def __len__(self) -> int:
        return len(self.tasks)


class EnvAgent(LitAgent):
    """The agent an :class:`Environment` offers: plays a task with the rollout's ``llm``; its reward."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    @property
    def max_rollout_tokens(self) -> int | None:
        """The environment's: the most tokens one rollout generates (``None``: unknown)."""
        return self.env.max_rollout_tokens

    def rollout(self, task: Any, llm: Any) -> float:
        return self.env.play(task, llm, self.env.temperature)

    def validation_rollout(self, task: Any, llm: Any) -> float:
        return self.env.play(task, llm, self.env.eval_temperature)

    def __repr__(self) -> str:
        return f"EnvAgent({self.env!r})"
