"""The serving state of rollouts, with one owner: which rollouts the server has seen and in what mode,
the engine requests each has in flight, which were cancelled, their keys, and the warnings given once.

Routes read and change it only through :class:`RolloutState`'s methods (``server.rollouts``); every
collection in it is bounded, so a server that runs for days holds the last 10,000 rollouts' entries.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import hmac
import secrets
import threading
from collections import OrderedDict
from typing import Any, Generic, TypeVar

__all__ = ["RecentDict", "RecentSet", "RolloutState"]

V = TypeVar("V")


class RecentSet:
    """The last ``size`` items added (a set whose memory stays bounded over a long run).

    >>> s = RecentSet(2)
    >>> for x in "abc": s.add(x)
    >>> ("a" in s, "c" in s, len(s))
    (False, True, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, None] = OrderedDict()  # the oldest first
        self._lock = threading.Lock()

    def __contains__(self, item: object) -> bool:
        return item in self._items

    def __len__(self) -> int:
        return len(self._items)

    def add(self, item: str) -> None:
        with self._lock:
            self._items[item] = None
            self._items.move_to_end(item)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


class RecentDict(Generic[V]):
    """The last ``size`` entries set (a mapping whose memory stays bounded over a long run).

    >>> d: RecentDict[int] = RecentDict(1)
    >>> d["a"] = 1; d["b"] = 2
    >>> (d.get("a"), d.get("b"))
    (None, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[str, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> V | None:
        with self._lock:
            return self._items.get(key)

    def __setitem__(self, key: str, value: V) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


class RolloutState:
    """What a server knows of the rollouts it serves (thread-safe; bounded to the last ``size``).

    >>> state = RolloutState()
    >>> state.remember("r1"); state.known("r1")
    True
    >>> state.key("r1") == state.key("r1") != state.key("r2")
    True
    >>> state.cancel("r1"), state.is_cancelled("r1"), state.track("r1", [])
    ([], True, False)
    >>> state.first_time("truncation"), state.first_time("truncation")
    (True, False)
    """

    def __init__(self, size: int = 10_000) -> None:
        self._known = RecentSet(size)  # rollouts seen in the store (not looked up again)
        self._modes: RecentDict[str] = RecentDict(size)  # rollout id -> mode (train, val, trace)
        # rollouts whose requests are refused (cancel); the oldest are forgotten (a rollout cancelled
        # that long ago gets no more calls: its agent ended or was given up)
        self._cancelled = RecentSet(size)
        self._lock = threading.Lock()
        self._inflight: dict[str, set[concurrent.futures.Future[Any]]] = {}  # rollout id -> engine futures
        self._secret = secrets.token_bytes(32)  # rollout keys are valid for this state's server only
        self._warned: set[str] = set()

    # -- the rollouts seen ------------------------------------------------------------------
    def known(self, rollout_id: str) -> bool:
        """Whether ``rollout_id`` was found in the store before (no need to look it up again)."""
        return rollout_id in self._known

    def remember(self, rollout_id: str) -> None:
        """Note that ``rollout_id`` exists in the store."""
        self._known.add(rollout_id)

    @property
    def known_count(self) -> int:
        """How many rollouts are remembered (at most ``size``)."""
        return len(self._known)

    def mode(self, rollout_id: str) -> str | None:
        """The mode (``train``, ``val``, ``trace``) noted for ``rollout_id``, else ``None``."""
        return self._modes.get(rollout_id)

    def set_mode(self, rollout_id: str, mode: str) -> None:
        self._modes[rollout_id] = mode

    # -- keys -------------------------------------------------------------------------------
    def key(self, rollout_id: str) -> str:
        """A key for ``rollout_id`` alone: an HMAC of the id under this state's secret."""
        digest = hmac.new(self._secret, rollout_id.encode(), hashlib.sha256).hexdigest()
        return f"agl-rk-{digest[:40]}"

    # -- requests in flight and cancellation -------------------------------------------------
    def is_cancelled(self, rollout_id: str | None) -> bool:
        return rollout_id is not None and rollout_id in self._cancelled

    @property
    def cancelled_count(self) -> int:
        """How many cancelled rollouts are remembered (at most ``size``)."""
        return len(self._cancelled)

    def cancel(self, rollout_id: str) -> list[concurrent.futures.Future[Any]]:
        """Refuse the rollout's later requests; returns the engine futures it has in flight now (the
        caller cancels them in its engine)."""
        with self._lock:
            self._cancelled.add(rollout_id)
            return list(self._inflight.get(rollout_id, ()))

    def track(self, rollout_id: str | None, futures: list[Any]) -> bool:
        """Register a rollout's engine futures; ``False`` (nothing registered) when it was cancelled."""
        if rollout_id is None:
            return True
        with self._lock:
            if rollout_id in self._cancelled:
                return False
            self._inflight.setdefault(rollout_id, set()).update(futures)
        return True

    def untrack(self, rollout_id: str | None, futures: list[Any]) -> None:
        """Forget futures registered with :meth:`track` (they finished or were given up)."""
        if rollout_id is None:
            return
        with self._lock:
            held = self._inflight.get(rollout_id)
            if held is not None:
                held.difference_update(futures)
                if not held:
                    del self._inflight[rollout_id]

    def in_flight(self, rollout_id: str | None = None) -> int:
        """How many engine requests ``rollout_id`` (every rollout, when ``None``) has in flight."""
        with self._lock:
            if rollout_id is None:
                return sum(len(v) for v in self._inflight.values())
            return len(self._inflight.get(rollout_id, ()))

    # -- warnings given once -----------------------------------------------------------------
    def first_time(self, what: str) -> bool:
        """``True`` the first time ``what`` is asked about, ``False`` after (for warnings given once)."""
        with self._lock:
            if what in self._warned:
                return False
            self._warned.add(what)
            return True
