"""Running the user's agent: one rollout per (task, sample), concurrently, each with its own LLM endpoint.

A crashing agent marks its rollout ``failed``; one that overruns ``timeout`` is marked ``timeout``;
neither stops the others. The agent's return value (or the reward it emitted) is the final reward.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..tracer import Tracer
from ..types import check_reward

__all__ = ["LitAgent", "RolloutResult", "RolloutSpec", "run_rollouts"]

logger = logging.getLogger("agentlightning_lite.rollouts")


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


@dataclass
class RolloutSpec:
    """One rollout to run."""

    task: Any
    mode: str = "train"
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class RolloutResult:
    """What one rollout came to."""

    rollout_id: str
    spec: RolloutSpec
    status: str
    reward: float | None
    error: str | None
    duration: float


def _call_agent(agent: Callable[..., Any], task: Any, llm: Any, mode: str) -> Any:
    if isinstance(agent, LitAgent):
        result = agent(task, llm, mode=mode)
    else:
        result = agent(task, llm)
    if inspect.isawaitable(result):
        result = asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


def run_rollouts(
    agent: Callable[..., Any],
    specs: Sequence[RolloutSpec],
    tracer: Tracer,
    llm_for: Callable[[str], Any],
    concurrency: int = 8,
    timeout: float | None = None,
    on_done: Callable[[RolloutResult], None] | None = None,
) -> list[RolloutResult]:
    """Run ``agent`` once per spec, ``concurrency`` at a time; results in spec order.

    Each rollout is created in ``tracer.store`` first, then the agent runs inside
    ``tracer.rollout(rollout_id=...)`` (so ``agl.emit_reward`` lands in it) with
    ``llm_for(rollout_id)`` as its model endpoint.
    """
    store = tracer.store
    started = [store.start_rollout(s.task, mode=s.mode, metadata=s.metadata) for s in specs]
    results: list[RolloutResult | None] = [None] * len(specs)
    began: dict[int, float] = {}

    def one(i: int) -> RolloutResult:
        spec, rid = specs[i], started[i].rollout_id
        began[i] = time.monotonic()
        t0 = time.perf_counter()
        status, reward, error = "succeeded", None, None
        try:
            with tracer.rollout(rollout_id=rid) as ro:
                value = _call_agent(agent, spec.task, llm_for(rid), spec.mode)
                if value is not None:
                    ro.reward(check_reward(value, "the agent's returned reward"))  # type: ignore[arg-type]
            reward = store.get_rollout(rid).reward  # type: ignore[union-attr]
        except BaseException as exc:  # the tracer marked the rollout failed/timeout already
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            status = "timeout" if isinstance(exc, TimeoutError) else "failed"
            error = f"{type(exc).__name__}: {exc}"
            logger.warning("rollout %s %s: %s", rid, status, error)
        return RolloutResult(rid, spec, status, reward, error, time.perf_counter() - t0)

    pool = concurrent.futures.ThreadPoolExecutor(
        max_workers=max(1, concurrency), thread_name_prefix="agl-rollout"
    )
    try:
        futures = {pool.submit(contextvars.copy_context().run, one, i): i for i in range(len(specs))}
        pending = set(futures)
        while pending:
            done, _ = concurrent.futures.wait(
                pending,
                timeout=None if timeout is None else 0.25,
                return_when=concurrent.futures.FIRST_COMPLETED,
            )
            finished = [(futures[f], f.result()) for f in done]
            pending -= done
            if timeout is not None:  # a thread cannot be killed: mark its rollout and move on
                now = time.monotonic()
                for fut in list(pending):
                    i = futures[fut]
                    t0 = began.get(i)
                    if t0 is not None and now - t0 > timeout:
                        pending.discard(fut)
                        rid = started[i].rollout_id
                        msg = f"TimeoutError: no result within {timeout} s"
                        store.finish_rollout(rid, status="timeout", error=msg, only_if_running=True)
                        finished.append((i, RolloutResult(rid, specs[i], "timeout", None, msg, now - t0)))
            for i, res in finished:
                results[i] = res
                if on_done is not None:
                    on_done(res)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return [r for r in results if r is not None]
