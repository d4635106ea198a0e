"""Calling the user's agent: the one way, used by the trainer's rollout threads and by runners.

An agent is a function ``(task, llm) -> reward | None`` (sync or ``async``) or an
:class:`LitAgent`. :func:`call_agent` calls it the same way wherever it runs (in the trainer's
process, under ``agl-lite runner``, in a Ray actor), so an agent that moves does not change
behaviour. This module imports nothing heavy (no torch): runners load it as it is.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

__all__ = ["LitAgent", "call_agent"]


class LitAgent:
    """Base class for agents that need set-up or state; a plain function works as well.

    Override :meth:`rollout` (sync or ``async``): it gets the task and an :class:`agl.LLM`
    whose ``base_url`` routes every call to this rollout, and returns the reward, or ``None``
    after calling ``agl.emit_reward`` itself. :meth:`validation_rollout` defaults to it.

    >>> import agentlightning_lite as agl
    >>> class Echo(agl.LitAgent):
    ...     def rollout(self, task, llm):
    ...         return 1.0 if task == "ok" else 0.0
    >>> Echo()("ok", llm=None)
    1.0
    """

    def rollout(self, task: Any, llm: Any) -> float | None:
        raise NotImplementedError("a LitAgent subclass implements rollout(task, llm)")

    def validation_rollout(self, task: Any, llm: Any) -> float | None:
        """The rollout used for ``mode="val"``; the training rollout unless overridden."""
        return self.rollout(task, llm)

    def __call__(self, task: Any, llm: Any, mode: str = "train") -> Any:
        if mode == "val":
            return self.validation_rollout(task, llm)
        return self.rollout(task, llm)


def call_agent(
    agent: Any,
    task: Any,
    llm: Any,
    mode: str = "train",
    on_cancel: Callable[[Callable[[], None]], None] | None = None,
) -> Any:
    """Run ``agent`` on ``task`` with ``llm`` in this thread; returns what the agent returned.

    An :class:`LitAgent` (or an object with ``rollout`` and ``validation_rollout`` methods, as
    Agent Lightning's) runs its ``validation_rollout`` when ``mode == "val"``, else its
    ``rollout``; anything else callable is called as ``agent(task, llm)``. A coroutine (an
    ``async`` agent) runs to its end in a new event loop of this thread; ``on_cancel`` is then
    given a function that cancels it from any thread (``asyncio.CancelledError`` at its current
    ``await``, raised from here). What the agent raises is raised from here.

    >>> async def agent(task, llm):
    ...     return float(task == "ok")
    >>> call_agent(agent, "ok", llm=None)
    1.0
    """
    if inspect.isclass(agent):
        raise TypeError(f"pass an agent instance or function, not the class {agent.__name__}")
    if isinstance(agent, LitAgent):
        result = agent(task, llm, mode=mode)
    elif callable(getattr(agent, "rollout", None)) and callable(getattr(agent, "validation_rollout", None)):
        result = agent.validation_rollout(task, llm) if mode == "val" else agent.rollout(task, llm)
    elif callable(agent):
        result = agent(task, llm)
    else:
        raise TypeError(f"an agent is a function (task, llm) -> reward or an agl.LitAgent, got {agent!r}")
    if inspect.isawaitable(result):
        result = _run_coroutine(result, on_cancel)
    return result


def _run_coroutine(awaitable: Any, on_cancel: Callable[[Callable[[], None]], None] | None) -> Any:
    loop = asyncio.new_event_loop()
    try:
        main = loop.create_task(_await(awaitable))
        if on_cancel is not None:

            def cancel() -> None:
                try:
                    loop.call_soon_threadsafe(main.cancel)
                except RuntimeError:  # the loop is closed: the agent has ended already
                    pass

            on_cancel(cancel)
        return loop.run_until_complete(main)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


async def _await(awaitable: Any) -> Any:
    return await awaitable
