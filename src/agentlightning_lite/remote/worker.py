"""A runner: worker threads that claim rollouts from a trainer, run the agent, and stream its spans back.

Each worker loops: claim a rollout (long-polling the trainer's queue), run the agent on its task
with an ``agl.LLM`` routed to that rollout, inside ``tracer.rollout(rollout_id=...)`` over a
:class:`RemoteStore` (so adapters, ``emit_reward`` and ``emit_signal`` work as in-process), then
report the result, which asks for the worker's next rollout in the same request (a rollout costs
one request when the queue has work; when it is empty the worker long-polls the claim route again).
A heartbeat thread renews the leases of the rollouts in flight. Each claim's
lease token goes with its heartbeats, spans, reward and result, and rides in the path of the
agent's ``llm.base_url`` (the claim's ``llm_path``), so the agent's own OpenAI clients carry it
without a change. While the
trainer is away (restarting, say) every call is retried with backoff: runners reconnect on their own.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._compat import build_sdk_types
from ..agent import call_agent
from ..serving.llm import LLM
from ..tracer import RolloutHandle, Tracer
from ..types import Rollout, check_reward
from .client import RemoteError, RunnerClient
from .remote_store import RemoteStore

__all__ = ["Runner", "load_agent"]

logger = logging.getLogger(__name__)


def load_agent(spec: str) -> Any:
    """Import an agent given as ``module:attribute`` or ``path/to/file.py:attribute``.

    >>> load_agent("agentlightning_lite.remote.worker:load_agent") is load_agent
    True
    """
    where, sep, attr = spec.rpartition(":")
    if not sep or not where or not attr:
        raise ValueError(f"an agent is 'module:attribute' or 'file.py:attribute', got {spec!r}")
    if where.endswith(".py") or os.sep in where:
        path = Path(where).resolve()
        if not path.exists():
            raise FileNotFoundError(f"no such file: {path}")
        mod_name = f"agl_agent_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot import {path}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module
        module_spec.loader.exec_module(module)
    else:
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(where)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"{where} has no attribute {attr!r}") from None


class Runner:
    """Run ``agent`` for a trainer at ``server``: ``workers`` rollouts at a time, until stopped.

    ``agent`` is a function ``(task, llm) -> reward | None`` (sync or async), an ``agl.LitAgent``,
    or a ``"module:attribute"`` string. ``max_rollouts`` stops the runner after that many
    rollouts (handy in tests and scripts); ``None`` runs until :meth:`stop` (or SIGTERM / Ctrl-C
    under :meth:`run`).

    >>> import agentlightning_lite as agl
    >>> def agent(task, llm):
    ...     reply = llm.openai_client().chat.completions.create(
    ...         model=llm.model, messages=[{"role": "user", "content": task}])
    ...     return float("4" in reply.choices[0].message.content)
    >>> runner = agl.remote.Runner(agent, "http://127.0.0.1:8765", api_key="secret", workers=4)
    >>> runner.run()  # doctest: +SKIP
    """

    def __init__(
        self,
        agent: Callable[..., Any] | str,
        server: str,
        api_key: str | None = None,
        workers: int = 1,
        worker_id: str | None = None,
        claim_wait: float = 5.0,
        max_rollouts: int | None = None,
        give_up_after: float | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.agent = load_agent(agent) if isinstance(agent, str) else agent
        self.server = server.rstrip("/")
        self.api_key = api_key
        self.workers = workers
        self.worker_id = worker_id or f"{socket.gethostname()}-{os.getpid()}"
        self.claim_wait = claim_wait
        self.max_rollouts = max_rollouts
        self.client = RunnerClient(
            self.server, api_key=api_key, give_up_after=give_up_after, max_connections=max(8, 2 * workers)
        )
        self.store = RemoteStore(self.client)
        self.tracer = Tracer(self.store)
        self.completed = 0  # rollouts run to the end by this runner
        self.counted = 0  # of which the trainer took the result as the rollout's outcome
        self.stuck = 0  # worker threads left running a sync agent past its timeout (each replaced)
        self._lease_timeout = 30.0
        self._active: dict[str, str] = {}  # rollout id -> its lease token
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._hb_stop = threading.Event()
        self._threads: list[threading.Thread] = []  # the heartbeat thread
        self._workers: list[threading.Thread] = []  # every worker thread started (replacements too)
        self._retired: set[threading.Thread] = set()  # workers replaced while their sync agent overran
        self._claims = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Runner:
        """Start the worker and heartbeat threads; returns at once."""
        if self._workers:
            return self
        build_sdk_types(imported_only=True)  # before the agents' threads parse their first replies
        for i in range(self.workers):
            t = threading.Thread(target=self._work, args=(f"{self.worker_id}/{i}",), name=f"agl-runner-{i}")
            t.daemon = True
            t.start()
            self._workers.append(t)
        hb = threading.Thread(target=self._heartbeats, name="agl-runner-heartbeat", daemon=True)
        hb.start()
        self._threads.append(hb)
        logger.info("runner %s: %d workers for %s", self.worker_id, self.workers, self.server)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming, let the rollouts in flight finish (up to ``timeout`` s), then close."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # rollouts in flight report first...
            with self._lock:
                if not self._active:
                    break
            time.sleep(0.05)
        self._hb_stop.set()
        self.store.close()
        self.client.close()
        # workers still waiting in a claim are daemon threads: not waited for (a claim granted
        # meanwhile, or with a result sent as the runner stopped, is not run; its lease runs out
        # and the trainer hands the rollout to another runner)
        for t in [*self._threads, *self._workers]:
            t.join(0.05)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers to end (``max_rollouts`` reached, or stopped); True when they did. A
        thread still running a sync agent past its timeout is not waited for (it was replaced)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                live = [t for t in self._workers if t.is_alive() and t not in self._retired]
            if not live:
                return True
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            live[0].join(0.2 if left is None else min(0.2, left))

    def run(self) -> None:
        """Run in the foreground until SIGTERM, Ctrl-C or ``max_rollouts``."""

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _term)
        self.start()
        try:
            while not self.join(0.5):
                pass
        except KeyboardInterrupt:
            logger.info("runner %s: stopping", self.worker_id)
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> Runner:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the loops ------------------------------------------------------------------------------
    def _take_slot(self) -> bool:
        with self._lock:
            if self.max_rollouts is not None and self._claims >= self.max_rollouts:
                return False
            self._claims += 1
            return True

    def _give_back_slot(self) -> None:
        with self._lock:
            self._claims -= 1

    def _work(self, worker: str) -> None:
        me = threading.current_thread()
        claimed: dict[str, Any] | None = None  # a claim that came with the last result (its slot taken)
        while not self._stop.is_set():  # a claim in hand when stopping lapses (see stop)
            if claimed is None:
                if not self._take_slot():
                    return
                try:
                    claimed = self.client.claim(worker, wait=self.claim_wait)
                except Exception as exc:
                    self._give_back_slot()
                    if self._stop.is_set():
                        return
                    if not isinstance(exc, RemoteError):
                        raise
                    logger.error("runner %s: claim refused: %s", worker, exc)
                    self._stop.wait(2.0)
                    continue
                if claimed is None or self._stop.is_set():
                    self._give_back_slot()
                    claimed = None
                    continue
            ended = threading.Event()  # the agent returned (or raised): its thread is not stuck
            with self._lock:
                retired = me in self._retired
            current, claimed = claimed, None
            try:
                claimed = self._run_one(
                    current,
                    functools.partial(self._replace, worker, me, ended),
                    ended,
                    None if retired else worker,
                )
            except Exception:  # never let one rollout end the worker
                logger.exception("runner %s: rollout %s", worker, current.get("rollout_id"))
            with self._lock:
                if me in self._retired and claimed is None:
                    # a new thread took this one's place while its agent overran (a claim that came
                    # with its result is run first, asking for no other)
                    self._retired.discard(me)
                    return

    def _replace(self, worker: str, thread: threading.Thread, ended: threading.Event) -> bool:
        """A sync agent overran its timeout in ``thread``, which no one can stop: a new worker thread
        takes its place (the runner keeps ``workers`` rollouts going), and ``thread`` ends once its agent
        returns. Nothing happens when the agent has returned meanwhile (``ended``)."""
        with self._lock:
            if ended.is_set():
                return False
            self._retired.add(thread)
            self.stuck += 1
            n = self.stuck
            if self._stop.is_set():
                return True
            t = threading.Thread(target=self._work, args=(f"{worker}.{n}",), name=f"agl-runner-{worker}.{n}")
            t.daemon = True
            self._workers.append(t)
            t.start()  # under the lock: join() never sees the old thread retired and this one not started
        return True

    def _run_one(
        self,
        claimed: dict[str, Any],
        replace: Callable[[], bool] | None = None,
        ended: threading.Event | None = None,
        worker: str | None = None,
    ) -> dict[str, Any] | None:
        """Run one claimed rollout; with ``worker``, its result asks for that worker's next rollout,
        returned here (its slot taken) when the trainer handed one out."""
        rid = claimed["rollout_id"]
        mode = claimed.get("mode", "train")
        self.store.register(
            Rollout(
                rollout_id=rid,
                task=claimed.get("task"),
                mode=mode,
                start_time=time.time(),
                metadata=claimed.get("metadata") or {},
            ),
            lease=claimed.get("lease"),
        )
        with self._lock:
            self._active[rid] = claimed.get("lease") or ""
            self._lease_timeout = float(claimed.get("lease_timeout") or self._lease_timeout)
        llm = LLM(
            base_url=self.server + claimed["llm_path"],
            model=claimed.get("model") or "policy",
            api_key=self.api_key or "agl-no-key",
            rollout_id=rid,
            rollout_key=claimed.get("rollout_key"),
        )
        timeout = claimed.get("timeout")
        asked = False
        cancel: list[Callable[[], None]] = []
        timer: threading.Timer | None = None
        try:
            with self.tracer.rollout(rollout_id=rid) as ro:
                if timeout is not None:
                    args = (rid, ro, cancel, timeout, replace)
                    timer = threading.Timer(float(timeout), self._time_out, args)
                    timer.daemon = True
                    timer.start()
                try:
                    value = call_agent(self.agent, claimed.get("task"), llm, mode, cancel.append)
                finally:
                    if ended is not None:
                        with self._lock:
                            ended.set()
                    # the result (sent as the rollout ends, just below) brings the next claim
                    asked = worker is not None and not self._stop.is_set() and self._take_slot()
                    if asked:
                        self.store.claim_with_result(rid, worker)  # type: ignore[arg-type]
                if value is not None:
                    ro.reward(check_reward(value, "the agent's returned reward"))  # type: ignore[arg-type]
        except (Exception, asyncio.CancelledError) as exc:  # recorded by the tracer (or _time_out)
            if not isinstance(exc, asyncio.CancelledError):
                logger.warning("rollout %s failed: %s: %s", rid, type(exc).__name__, exc)
        finally:
            if timer is not None:
                timer.cancel()
            with self._lock:
                self._active.pop(rid, None)
                self.completed += 1
                if (self.store.last_result.get(rid) or {}).get("counted"):
                    self.counted += 1
            following = self.store.take_claim(rid)
            self.store.forget(rid)
            if asked and following is None:
                self._give_back_slot()
        return following

    def _time_out(
        self,
        rid: str,
        ro: RolloutHandle,
        cancel: list[Callable[[], None]],
        timeout: float,
        replace: Callable[[], bool] | None = None,
    ) -> None:
        """The claim's ``timeout`` passed: as in the trainer's process, the rollout is reported
        ``timeout``, what the agent records from now on is dropped, an async agent is cancelled,
        and a sync one (which no thread can stop) is left to end on its own while a new worker
        thread takes over its thread's place (``replace``)."""
        if not ro.give_up():
            return  # the agent finished first
        with self._lock:
            self._active.pop(rid, None)  # no more heartbeats for it
        try:
            self.store.finish_rollout(
                rid,
                status="timeout",
                error=f"TimeoutError: no result within {timeout} s",
                only_if_running=True,
            )
        except Exception as exc:
            logger.warning("rollout %s: reporting its timeout failed: %s", rid, exc)
        for c in cancel:
            c()
        if not cancel and (replace is None or replace()):
            logger.warning(
                "rollout %s timed out; its (sync) agent is still running in its thread (%d such "
                "thread(s) in this runner), and a new worker thread took its place: give the agent's "
                "blocking calls a timeout",
                rid,
                self.stuck,
            )

    def _heartbeats(self) -> None:
        last = time.monotonic()
        while not self._hb_stop.wait(0.2):
            if time.monotonic() - last < self._lease_timeout / 3:
                continue
            last = time.monotonic()
            with self._lock:
                active = list(self._active)
                leases = [self._active[rid] for rid in active]
            if not active:
                continue
            try:
                lost = self.client.heartbeat(self.worker_id, active, leases=leases)
            except RemoteError as exc:
                logger.warning("runner %s: heartbeat failed: %s", self.worker_id, exc)
                continue
            for rid in lost:
                logger.warning("rollout %s: lease lost (its result will not be trained on)", rid)
