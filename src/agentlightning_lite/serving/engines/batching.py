"""An engine that batches: a background loop groups the requests that arrive together into batches
and generates each batch at once (``HFEngine``)."""

from __future__ import annotations

import abc
import collections
import concurrent.futures
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from .base import Engine, GenRequest, GenResult, RunningRequest, describe_running

__all__ = ["BatchingEngine", "RunningRequest", "describe_running"]

_STOP = object()

#: a request taken from the queue and the future its caller holds
Item = tuple[GenRequest, "concurrent.futures.Future[GenResult]"]


class BatchingEngine(Engine):
    """An engine whose requests go through one background loop that batches them.

    The loop takes the first waiting request, keeps collecting for ``batch_window_s`` seconds
    (or until ``max_batch_size`` requests), and hands the batch to :meth:`_generate_batch`.
    Requests that arrive while a batch runs form the next one. Clients served together tend to
    come back together (agents answering their next turn): while fewer requests than the last
    batch held have arrived, the loop waits up to ``regroup_wait_s`` for them, so concurrent
    agents keep sharing batches instead of drifting into smaller ones. A caller that knows how many
    clients are about to send requests (the trainer, at the start of a step) says so with
    :meth:`expect`, so the first batch holds them all rather than the first few to arrive.
    """

    def __init__(
        self, max_batch_size: int = 16, batch_window_s: float = 0.01, regroup_wait_s: float = 0.1
    ) -> None:
        super().__init__()
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        self.max_batch_size = max_batch_size
        self.batch_window_s = batch_window_s
        self.regroup_wait_s = regroup_wait_s
        self._last_batch = 1
        self._expect_wait_s = 0.0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._loop_thread: threading.Thread | None = None
        self._loop_lock = threading.Lock()
        self._abort_lock = threading.Lock()
        self._aborted: set[int] = set()  # id()s of running requests to stop at the next step
        self._running: dict[int, GenRequest] = {}  # id(future) -> its request, while in a batch
        # id(future) -> (when it started, its adapter, its tokens so far if the engine reports them)
        self._progress: dict[int, tuple[float, str | None, Sequence[int] | None]] = {}
        self._pending: collections.deque[Item] = collections.deque()  # taken from the queue, not started
        self._stopping = False  # close() was called: start nothing more

    @abc.abstractmethod
    def _generate_batch(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        """Generate for one batch (called from the batching loop only).

        A subclass that decodes step by step calls :meth:`_should_abort` for each unfinished row
        and stops that row (``finish_reason="abort"``) when it says so.
        """

    def cancel_request(self, future: concurrent.futures.Future[GenResult]) -> bool:
        if future.cancel():
            return True
        with self._abort_lock:
            request = self._running.get(id(future))
            if request is None or future.done():
                return False
            self._aborted.add(id(request))
            return True

    def running(self) -> list[RunningRequest]:
        """The requests generating now, the longest running first: what a caller whose requests time
        out can report (which replies were still being generated, for how long, how many tokens so far).

        >>> class Echo(BatchingEngine):
        ...     def _generate_batch(self, requests):
        ...         return []
        >>> Echo().running()
        []
        """
        now = time.monotonic()
        with self._abort_lock:
            out = []
            for key, request in self._running.items():
                started, adapter, tokens = self._progress.get(key, (now, None, None))
                out.append(
                    RunningRequest(
                        request.request_id,
                        request.session,
                        len(request.prompt_token_ids),
                        len(tokens) if tokens is not None else 0,
                        now - started,
                        adapter,
                    )
                )
        return sorted(out, key=lambda r: -r.seconds)

    def _started(
        self,
        request: GenRequest,
        future: concurrent.futures.Future[GenResult],
        adapter: str | None = None,
        tokens: Sequence[int] | None = None,
    ) -> None:
        """Note that ``request`` started generating (``tokens``: a list the engine appends to)."""
        with self._abort_lock:
            self._running[id(future)] = request
            before = self._progress.get(id(future))
            self._progress[id(future)] = (before[0] if before else time.monotonic(), adapter, tokens)

    def _should_abort(self, request: GenRequest) -> bool:
        """Whether :meth:`cancel` asked a running request to stop (cheap: call it every step)."""
        return bool(self._aborted) and id(request) in self._aborted

    def expect(self, n: int, wait_s: float = 2.0) -> None:
        """Announce that ``n`` requests are about to arrive together (``n`` agents starting).

        The next batch waits up to ``wait_s`` seconds after its first request for the others
        (up to ``max_batch_size``), instead of starting with the first few to arrive.

        >>> class Echo(BatchingEngine):
        ...     def _generate_batch(self, requests):
        ...         return [GenResult(prompt_token_ids=r.prompt_token_ids, token_ids=[len(requests)],
        ...                           logprobs=[0.0], text="", finish_reason="stop") for r in requests]
        >>> import threading
        >>> engine = Echo(max_batch_size=8)
        >>> engine.expect(3)
        >>> out = []
        >>> threads = [threading.Thread(target=lambda: out.append(engine.submit(
        ...     GenRequest(prompt_token_ids=[1])).result().token_ids)) for _ in range(3)]
        >>> for t in threads: t.start()
        >>> for t in threads: t.join()
        >>> out  # one batch of all three
        [[3], [3], [3]]
        >>> engine.close()
        """
        if n < 1:
            raise ValueError("expect(n) needs n >= 1")
        self._last_batch = n
        self._expect_wait_s = max(0.0, wait_s)

    def generate(self, requests: Sequence[GenRequest]) -> list[GenResult]:
        futures = [self.submit(r) for r in requests]
        return [f.result() for f in futures]

    def start_request(self, request: GenRequest) -> concurrent.futures.Future[GenResult]:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")
        self._ensure_loop()
        fut: concurrent.futures.Future[GenResult] = concurrent.futures.Future()
        self._queue.put((request, fut))
        return fut

    def _ensure_loop(self) -> None:
        if self._loop_thread is not None and self._loop_thread.is_alive():
            return
        with self._loop_lock:
            if self._loop_thread is None or not self._loop_thread.is_alive():
                self._loop_thread = threading.Thread(
                    target=self._loop, name=f"agl-{type(self).__name__}-batcher", daemon=True
                )
                self._loop_thread.start()

    def _next(self, timeout: float | None) -> Any:
        """The next request: one taken earlier and not started first, else from the queue (waiting up
        to ``timeout`` seconds, ``None``: for ever); raises ``queue.Empty``."""
        if self._pending:
            return self._pending.popleft()
        if timeout is None:
            return self._queue.get()
        return self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()

    def _take_waiting(self) -> bool:
        """Move the requests queued now to ``_pending`` without waiting (an engine that lets requests
        join a running batch calls it between steps); ``False`` once :meth:`close` was called."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return not self._stopping
            if item is _STOP:
                self._queue.put(_STOP)
                self._stopping = True
                return False
            self._pending.append(item)

    def _collect(self) -> list[Item] | None:
        if self._stopping:
            return None
        first = self._next(None)
        if first is _STOP:
            self._stopping = True
            return None
        batch = [first]
        start = time.monotonic()
        window = start + self.batch_window_s
        regroup = start + max(self.batch_window_s, self.regroup_wait_s, self._expect_wait_s)
        self._expect_wait_s = 0.0
        target = min(self._last_batch, self.max_batch_size)
        while len(batch) < self.max_batch_size:
            timeout = (regroup if len(batch) < target else window) - time.monotonic()
            try:
                item = self._next(timeout)
            except queue.Empty:
                break
            if item is _STOP:
                self._queue.put(_STOP)
                break
            batch.append(item)
        self._last_batch = len(batch)
        return batch

    def _loop(self) -> None:
        while True:
            batch = self._collect()
            if batch is None:
                return
            self._serve(batch)

    def _serve(self, batch: list[Item]) -> None:
        """Generate for a collected batch and resolve its futures: :meth:`_generate_batch` on the
        requests not cancelled meanwhile. An engine that batches continuously overrides it (its
        requests join and leave the running batch between steps: ``HFEngine``)."""
        live = [(r, f) for r, f in batch if f.set_running_or_notify_cancel()]
        if not live:
            return
        requests = [r for r, _ in live]
        for r, f in live:
            self._started(r, f)
        t0 = time.perf_counter()
        try:
            results = self._generate_batch(requests)
            if len(results) != len(requests):
                raise RuntimeError(f"engine returned {len(results)} results for {len(requests)} requests")
        except BaseException as exc:  # every waiting caller gets the error; the loop goes on
            for _, f in live:
                f.set_exception(exc)
            self._forget(live)
            return
        self._record_batch(requests, results, time.perf_counter() - t0)
        for (_, f), res in zip(live, results, strict=True):
            f.set_result(res)
        self._forget(live)

    def _forget(self, live: Sequence[Item]) -> None:
        with self._abort_lock:
            for r, f in live:
                self._running.pop(id(f), None)
                self._progress.pop(id(f), None)
                self._aborted.discard(id(r))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        if self._loop_thread is not None:
            self._loop_thread.join(timeout=30)
        while True:  # fail whatever is still queued
            try:
                item = self._pending.popleft() if self._pending else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP and item[1].set_running_or_notify_cancel():
                item[1].set_exception(RuntimeError(f"{type(self).__name__} closed"))
        super().close()
