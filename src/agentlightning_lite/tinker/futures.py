"""The future protocol of the Tinker API: an operation is submitted, answered at once with a request
id, run in the background, and its outcome long-polled through ``/retrieve_future``.

:class:`FutureTable` holds the outcomes by request id (set from worker threads, awaited from the
server's event loop); :class:`OrderedQueue` runs the operations of each training model in ``seq_id``
order on one worker thread, whatever order their requests arrive in.

>>> import asyncio
>>> table = FutureTable()
>>> rid = table.create()
>>> table.resolve(rid, Outcome(json={"metrics": {}}))
>>> asyncio.run(table.wait(rid, timeout=0.1)).json
{'metrics': {}}
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["FutureTable", "OpError", "OrderedQueue", "Outcome"]

logger = logging.getLogger(__name__)

Category = Literal["unknown", "server", "user"]


class OpError(Exception):
    """An operation that failed for a reason the caller can act on: its message reaches the client as
    ``{"error": message, "category": category}`` (``"user"``: the request was wrong).

    >>> OpError("unknown model id 'x'").category
    'user'
    """

    def __init__(self, message: str, category: Category = "user", status: int | None = None) -> None:
        super().__init__(message)
        self.category: Category = category
        self.status = status  #: the HTTP status when the request itself is refused (``None``: by kind)


@dataclass
class Outcome:
    """What an operation produced: a JSON object, and for the two protobuf result types also the
    encoded protobuf (sent when the client's ``Accept`` asks for it); or an error.

    >>> Outcome(error="bad loss", category="user").body()
    {'error': 'bad loss', 'category': 'user'}
    """

    json: dict[str, Any] | None = None
    proto: bytes | None = None
    error: str | None = None
    category: Category = "unknown"

    def body(self) -> dict[str, Any]:
        """The JSON answer of ``/retrieve_future`` for this outcome."""
        if self.error is not None:
            return {"error": self.error, "category": self.category}
        return dict(self.json or {})


@dataclass
class _Entry:
    created: float
    outcome: Outcome | None = None
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


class FutureTable:
    """Outcomes of submitted operations by request id.

    ``keep``: how many finished outcomes are kept (the oldest go first); an outcome stays readable
    after it was retrieved, so a client that lost the answer can ask again.
    """

    def __init__(self, keep: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._finished: collections.deque[str] = collections.deque()
        self._ids = itertools.count(1)
        self.keep = int(keep)

    def create(self) -> str:
        """A new pending request id."""
        with self._lock:
            rid = f"req-{next(self._ids)}"
            self._entries[rid] = _Entry(time.monotonic())
        return rid

    def known(self, request_id: str) -> bool:
        """Whether ``request_id`` was handed out (and is not yet forgotten)."""
        with self._lock:
            return request_id in self._entries

    def resolve(self, request_id: str, outcome: Outcome) -> None:
        """Set the outcome of ``request_id`` (from any thread) and wake its pollers."""
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(f"unknown request id {request_id!r}")
            if entry.outcome is not None:
                raise RuntimeError(f"request {request_id!r} already has its outcome")
            entry.outcome = outcome
            waiters, entry.waiters = entry.waiters, []
            self._finished.append(request_id)
            while len(self._finished) > self.keep:
                self._entries.pop(self._finished.popleft(), None)
        for loop, event in waiters:
            loop.call_soon_threadsafe(event.set)

    def run(self, request_id: str, fn: Callable[[], Outcome]) -> None:
        """Run ``fn`` and resolve ``request_id`` with what it returns, or with its error: an
        :class:`OpError` keeps its message and category; anything else is a ``"server"`` error named
        by its type and message (and logged with its traceback)."""
        try:
            outcome = fn()
        except OpError as exc:
            outcome = Outcome(error=str(exc), category=exc.category)
        except Exception as exc:
            logger.exception("operation %s failed", request_id)
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}", category="server")
        self.resolve(request_id, outcome)

    async def wait(self, request_id: str, timeout: float) -> Outcome | None:
        """The outcome of ``request_id``, waiting up to ``timeout`` seconds (``None``: not done yet).
        Raises ``KeyError`` for an id this table never handed out (or has forgotten)."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        with self._lock:
            entry = self._entries.get(request_id)
            if entry is None:
                raise KeyError(request_id)
            if entry.outcome is not None:
                return entry.outcome
            entry.waiters.append((loop, event))
        try:
            await asyncio.wait_for(event.wait(), timeout)
        except asyncio.TimeoutError:
            with self._lock:
                if (loop, event) in entry.waiters:
                    entry.waiters.remove((loop, event))
        return entry.outcome


class OrderedQueue:
    """Run operations on one worker thread: those of a training model in ``seq_id`` order, the others
    (``seq_id=None``: creating a model) as they come.

    A model's first operation is ``seq_id`` 1 (the SDK numbers each training client's requests from 1);
    an operation whose ``seq_id`` is ahead waits for the ones before it. The same ``(model, seq_id)``
    submitted again (a retried request) gets the first submission's request id back.

    >>> table = FutureTable()
    >>> done = []
    >>> q = OrderedQueue(table)
    >>> q.open("m")
    >>> r2 = q.submit("m", 2, lambda: done.append(2) or Outcome(json={}))
    >>> r1 = q.submit("m", 1, lambda: done.append(1) or Outcome(json={}))
    >>> q.submit("m", 1, lambda: Outcome(json={})) == r1
    True
    >>> q.drain(5.0); done
    [1, 2]
    >>> q.close()
    """

    def __init__(self, table: FutureTable) -> None:
        self.table = table
        self._lock = threading.Lock()
        self._next: dict[str, int] = {}
        self._held: dict[str, dict[int, tuple[str, Callable[[], Outcome]]]] = {}
        self._seen: dict[tuple[str, int], tuple[str, str | None]] = {}  # -> request id, fingerprint
        self._queue: queue.Queue[tuple[str, Callable[[], Outcome]] | None] = queue.Queue()
        self._idle = threading.Condition(self._lock)
        self._busy = 0
        self._thread = threading.Thread(target=self._work, name="agl-tinker-train", daemon=True)
        self._thread.start()

    def open(self, model: str, first_seq_id: int = 1) -> None:
        """Start ordering the operations of ``model`` (its first one is ``first_seq_id``)."""
        with self._lock:
            self._next.setdefault(model, first_seq_id)
            self._held.setdefault(model, {})

    def forget(self, model: str, why: str = "its session finished") -> list[int]:
        """Stop accepting operations for ``model``; the ones still held for an earlier ``seq_id`` that
        never came resolve to an error saying so (nothing is left waiting). Their ``seq_id`` values."""
        with self._lock:
            self._next.pop(model, None)
            held = self._held.pop(model, None) or {}
        for seq_id, (rid, _) in sorted(held.items()):
            message = (
                f"seq_id {seq_id} of model {model!r} never ran: {why} before the seq_ids before it arrived"
            )
            self.table.resolve(rid, Outcome(error=message, category="user"))
        return sorted(held)

    def submit(
        self, model: str | None, seq_id: int | None, fn: Callable[[], Outcome], fingerprint: str | None = None
    ) -> str:
        """Queue ``fn`` (run in ``seq_id`` order among ``model``'s operations); its request id. The
        same ``(model, seq_id)`` again is the same request retried (its first request id) unless its
        ``fingerprint`` (of the request's body) differs: then two clients race on one model, and the
        second gets an :class:`OpError`."""
        with self._lock:
            if model is None or seq_id is None:
                rid = self.table.create()
                self._push(rid, fn)
                return rid
            if model not in self._next:
                raise OpError(f"unknown model id {model!r}: create it first (create_model or load_weights)")
            if not isinstance(seq_id, int) or seq_id < 1:
                raise OpError(f"seq_id must be an integer >= 1, got {seq_id!r}")
            seen = self._seen.get((model, seq_id))
            if seen is not None:
                rid, prior = seen
                if fingerprint is not None and prior is not None and prior != fingerprint:
                    raise OpError(
                        f"seq_id {seq_id} of model {model!r} was already submitted with a different request: "
                        "one training client drives a model, in its own seq_id order (are two clients "
                        "using the same model?)"
                    )
                return rid
            if seq_id < self._next[model]:
                raise OpError(
                    f"seq_id {seq_id} of model {model!r} comes after {self._next[model] - 1} already ran "
                    "and was never submitted: sequence numbers cannot go back"
                )
            rid = self.table.create()
            self._seen[(model, seq_id)] = (rid, fingerprint)
            self._held[model][seq_id] = (rid, fn)
            held = self._held[model]
            while self._next[model] in held:
                self._push(*held.pop(self._next[model]))
                self._next[model] += 1
            return rid

    def _push(self, rid: str, fn: Callable[[], Outcome]) -> None:
        self._busy += 1
        self._queue.put((rid, fn))

    def waiting(self, model: str) -> list[int]:
        """The ``seq_id`` values of ``model`` held until the ones before them arrive."""
        with self._lock:
            return sorted(self._held.get(model, {}))

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            rid, fn = item
            self.table.run(rid, fn)
            with self._lock:
                self._busy -= 1
                self._idle.notify_all()

    def drain(self, timeout: float) -> None:
        """Wait until every queued operation ran (tests, shutdown)."""
        with self._lock:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError(f"{self._busy} operations still queued after {timeout} s")

    def close(self) -> None:
        """Stop the worker once the queued operations ran."""
        self._queue.put(None)
        self._thread.join(30.0)
