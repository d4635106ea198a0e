"""Running the user's agent: one rollout per (task, sample), concurrently, each with its own LLM endpoint.

A crashing agent marks its rollout ``failed``; one that overruns ``timeout`` is marked ``timeout``;
neither stops the others. The agent's return value (or the reward it emitted) is the final reward.
The agent is called by :func:`agentlightning_lite.agent.call_agent`, as runners call it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._compat import build_sdk_types
from ..agent import LitAgent, call_agent
from ..tracer import RolloutHandle, Tracer
from ..types import check_reward

__all__ = ["MAX_HUNG_THREADS", "LitAgent", "RolloutResult", "RolloutSpec", "hung_threads", "run_rollouts"]

logger = logging.getLogger(__name__)


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


#: most agent threads left hanging past their timeout (process-wide) before ``run_rollouts`` refuses
#: to start more rollouts: a sync thread cannot be killed, so each one keeps its memory and sockets
MAX_HUNG_THREADS = 64

_hung_lock = threading.Lock()
_hung: set[threading.Thread] = set()


def hung_threads() -> list[threading.Thread]:
    """The agent threads still running after their rollout timed out (daemon threads)."""
    with _hung_lock:
        _hung.difference_update([t for t in _hung if not t.is_alive()])
        return list(_hung)


def run_rollouts(
    agent: Callable[..., Any],
    specs: Sequence[RolloutSpec],
    tracer: Tracer,
    llm_for: Callable[[str], Any],
    concurrency: int = 8,
    timeout: float | None = None,
    on_done: Callable[[RolloutResult], None] | None = None,
    on_timeout: Callable[[str], None] | None = None,
    describe: Callable[[str], str | None] | None = None,
    cancel: threading.Event | None = None,
) -> list[RolloutResult]:
    """Run ``agent`` once per spec, ``concurrency`` at a time; results in spec order.

    Each rollout is created in ``tracer.store`` first, then the agent runs inside
    ``tracer.rollout(rollout_id=...)`` (so ``agl.emit_reward`` lands in it) with
    ``llm_for(rollout_id)`` as its model endpoint, in a daemon thread of its own.

    A rollout past ``timeout`` seconds is marked ``timeout`` and ``on_timeout(rollout_id)`` is
    called (the trainer cancels its engine requests there); the others go on. ``describe(rollout_id)``,
    asked first, names the replies of that rollout still generating (their tokens so far), and its
    timeout error says so. An ``async`` agent
    is cancelled (``CancelledError`` at its current ``await``) and its thread ends. A sync agent's
    thread cannot be killed: it is left running as a daemon thread (it never keeps the process
    from exiting), a free slot takes its place, and it is counted in :func:`hung_threads`; past
    ``MAX_HUNG_THREADS`` of them, ``RuntimeError`` is raised. Nothing it does after the timeout
    reaches the ``timeout`` rollout: its returned reward and the rewards and signals it emits are
    dropped, and the store drops any span it starts (see :class:`~agentlightning_lite.store.Store`).

    Once ``cancel`` is set (or an error or Ctrl-C reaches the loop), every rollout not yet finished is
    given up the same way and marked ``failed`` (``CancelledError``), and this returns (or re-raises) at once.
    """
    if len(hung_threads()) > MAX_HUNG_THREADS:
        raise RuntimeError(
            f"{len(hung_threads())} agent threads are still running after their rollouts timed out "
            f"(at most {MAX_HUNG_THREADS}): the agent hangs; fix it (or give its blocking calls a timeout)"
        )
    # the SDKs the agent imported build their response types now, not in its threads at once
    build_sdk_types(imported_only=True)
    store = tracer.store
    started = [store.start_rollout(s.task, mode=s.mode, metadata=s.metadata) for s in specs]
    results: list[RolloutResult | None] = [None] * len(specs)
    began: dict[int, float] = {}
    cancel_async: dict[int, Callable[[], None]] = {}
    handles: dict[
        int, RolloutHandle
    ] = {}  # the agent's rollout handle, to close it when the rollout times out
    threads: dict[int, threading.Thread] = {}
    done_q: queue.Queue[tuple[int, RolloutResult]] = queue.Queue()

    def one(i: int) -> None:
        spec, rid = specs[i], started[i].rollout_id
        t0 = time.perf_counter()
        status, reward, error = "succeeded", None, None
        try:
            with tracer.rollout(rollout_id=rid) as ro:
                handles[i] = ro
                value = call_agent(
                    agent, spec.task, llm_for(rid), spec.mode, lambda c: cancel_async.__setitem__(i, c)
                )
                if value is not None:
                    ro.reward(check_reward(value, "the agent's returned reward"))  # type: ignore[arg-type]
            reward = store.get_rollout(rid).reward  # type: ignore[union-attr]
        except BaseException as exc:  # the tracer marked the rollout failed/timeout already
            status = "timeout" if isinstance(exc, (TimeoutError, asyncio.CancelledError)) else "failed"
            error = f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, asyncio.CancelledError):
                logger.warning("rollout %s %s: %s", rid, status, error)
        done_q.put((i, RolloutResult(rid, spec, status, reward, error, time.perf_counter() - t0)))

    ctx = contextvars.copy_context()
    waiting = list(range(len(specs)))
    waiting.reverse()
    running: set[int] = set()
    finished = 0

    def _collect_loop() -> None:
        nonlocal finished
        while finished < len(specs):
            while waiting and len(running) < max(1, concurrency):
                i = waiting.pop()
                began[i] = time.monotonic()
                t = threading.Thread(
                    target=ctx.copy().run, args=(one, i), name=f"agl-rollout-{i}", daemon=True
                )
                threads[i] = t
                running.add(i)
                t.start()
            try:
                poll = None if timeout is None and cancel is None else 0.1
                item: tuple[int, RolloutResult] | None = done_q.get(timeout=poll)
            except queue.Empty:
                item = None
            ready = [item] if item is not None else []
            if item is not None:
                running.discard(item[0])
            if timeout is not None:
                now = time.monotonic()
                for i in list(running):
                    if now - began[i] > timeout:
                        rid = started[i].rollout_id
                        msg = f"TimeoutError: no result within {timeout} s"
                        if describe is not None and (detail := describe(rid)):
                            msg += (
                                f" ({detail}: lower the agent's max_tokens or raise "
                                "RolloutConfig(timeout=...))"
                            )
                        store.finish_rollout(rid, status="timeout", error=msg, only_if_running=True)
                        if i in handles:  # what the agent records from now on is dropped
                            handles[i].give_up()
                        ready.append((i, RolloutResult(rid, specs[i], "timeout", None, msg, now - began[i])))
                        running.discard(i)
                        _give_up(i, rid, threads[i], cancel_async.get(i), on_timeout)
            for i, res in ready:
                if results[i] is not None:
                    continue  # a timed-out rollout's late result: ignored
                running.discard(i)
                results[i] = res
                finished += 1
                if on_done is not None:
                    on_done(res)
            if cancel is not None and cancel.is_set():
                abandon("the rollouts were cancelled (training stopped)")

    def abandon(reason: str) -> None:
        """Give up every rollout without a result: ``failed`` in the store and in ``results``."""
        nonlocal finished
        msg = f"CancelledError: {reason}"
        for i in range(len(specs)):
            if results[i] is not None:
                continue
            rid = started[i].rollout_id
            store.finish_rollout(rid, status="failed", error=msg, only_if_running=True)
            if i in handles:
                handles[i].give_up()
            spent = time.monotonic() - began.get(i, time.monotonic())
            results[i], finished = RolloutResult(rid, specs[i], "failed", None, msg, spent), finished + 1
            if i in running:
                _give_up(i, rid, threads[i], cancel_async.get(i), on_timeout, "was cancelled")
        running.clear()

    try:
        _collect_loop()
    except BaseException:
        abandon("the run stopped")
        raise
    return [r for r in results if r is not None]


def _give_up(
    i: int,
    rid: str,
    thread: threading.Thread,
    cancel: Callable[[], None] | None,
    on_timeout: Callable[[str], None] | None,
    why: str = "timed out",
) -> None:
    """A rollout timed out (or was cancelled): cancel its engine requests, cancel an async agent,
    count a hung thread."""
    if on_timeout is not None:
        try:
            on_timeout(rid)
        except Exception:
            logger.exception("rollout %s: cancelling its requests failed", rid)
    if cancel is not None:
        cancel()
        thread.join(1.0)
    if thread.is_alive():
        with _hung_lock:
            _hung.add(thread)
        n = len(hung_threads())
        logger.warning(
            "rollout %s %s; its agent thread is still running (a sync thread cannot be stopped): "
            "%d such thread(s) in this process%s",
            rid,
            why,
            n,
            " -- the agent hangs: give its blocking calls a timeout" if n > 1 else "",
        )
