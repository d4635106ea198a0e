"""The one interface every store implements: rollouts and their spans."""

from __future__ import annotations

import abc
import functools
import logging
import os
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

from .._json import jsonable_copy
from ..errors import RolloutExistsError, UnknownRolloutError
from ..ids import new_rollout_id
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, Rollout, Span, check_reward
from .rows import SpanRow, row_to_span

logger = logging.getLogger(__name__)

#: the metadata key under which a rollout records the process that started it
OWNER_KEY = "agl.owner"

#: the methods a store's own fast rollout hooks stand in for
_ROLLOUT_METHODS = (
    "start_rollout",
    "finish_rollout",
    "get_rollout",
    "insert_rollout",
    "update_rollout",
    "rollout_for_update",
)

#: how many rollouts' late-write warnings are remembered (one warning per rollout, then debug)
_WARNED_LIMIT = 4096
_warned_late: dict[str, None] = {}
_warned_lock = threading.Lock()


def is_late(start_time: float, status: str, end_time: float | None) -> bool:
    """Whether a span that started at ``start_time`` is too late for a rollout in ``status``.

    A rollout that has ended (any status but ``running``) accepts only spans that started at or
    before its ``end_time``: those were made while it ran (an LLM call whose span is flushed in a
    batch just after the end, say). A span started after the end comes from an agent that went on
    past its rollout (a sync agent past its timeout) and is dropped.
    """
    return status != "running" and end_time is not None and start_time > end_time


def log_dropped(moved: list[tuple[SpanRow, str]], late: list[tuple[SpanRow, str, float]]) -> None:
    """Log span writes a store refused: ``moved`` (row, stored rollout), ``late`` (row, status, end)."""
    if moved:
        r, stored = moved[0]
        logger.warning(
            "refused %d span write(s) that would move a span to another rollout: span %s (%r) is stored "
            "in rollout %s and was written again for rollout %s%s; a span id belongs to one rollout",
            len(moved),
            r[0],
            r[4],
            stored,
            r[1],
            "" if len(moved) == 1 else f" (and {len(moved) - 1} more)",
        )
    for r, status, end_time in late:
        rid = r[1]
        with _warned_lock:
            first = rid not in _warned_late
            if first:
                _warned_late[rid] = None
                while len(_warned_late) > _WARNED_LIMIT:
                    del _warned_late[next(iter(_warned_late))]
        logger.log(
            logging.WARNING if first else logging.DEBUG,
            "dropped span %s (%s %r) of rollout %s: it started %.3f s after the rollout ended (%s); "
            "an agent that goes on past its rollout's end writes nothing into it%s",
            r[0],
            r[3],
            r[4],
            rid,
            r[6] - end_time,
            status,
            " (more such drops for this rollout are logged at debug level)" if first else "",
        )


@functools.lru_cache(maxsize=1)
def host_name() -> str:
    """This machine's host name, as recorded in a rollout's owner (read once)."""
    return socket.gethostname()


_pid = os.getpid()  # this process's id, read once (and again in a forked child)


def _renew_pid() -> None:
    global _pid
    _pid = os.getpid()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_renew_pid)
else:  # pragma: no cover - no fork on this platform: read it every time
    _pid = -1


def owner() -> dict[str, Any]:
    """This process as a rollout's owner: ``{"pid": ..., "host": ...}``."""
    return {"pid": _pid if _pid >= 0 else os.getpid(), "host": host_name()}


def rollout_payload(task: Any, metadata: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The task and metadata :meth:`Store.start_rollout` records: JSON-safe copies, the metadata with
    its owner (this process unless it names one).

    >>> task, meta = rollout_payload({"q": (1, 2)}, {"step": 3})
    >>> task, sorted(meta), meta["agl.owner"]["pid"] == os.getpid()
    ({'q': [1, 2]}, ['agl.owner', 'step'], True)
    """
    if not metadata:  # the tracer's usual case: the copy of {OWNER_KEY: owner()}, made directly
        return jsonable_copy(task), {OWNER_KEY: owner()}
    return jsonable_copy(task), jsonable_copy({**metadata, OWNER_KEY: metadata.get(OWNER_KEY) or owner()})


class Store(abc.ABC):
    """Where rollouts and spans live. ``MemoryStore`` and ``SQLiteStore`` implement it.

    All methods are thread-safe. Stores are context managers (``close()`` on exit).

    Span writes follow two rules, the same in every store (a refused write is dropped and logged on
    the ``agentlightning_lite.store.base`` logger, never raised: SQLiteStore only finds out when its batch
    commits):

    - **a span id belongs to one rollout.** Writing a span id already stored under another rollout
      is refused; the stored span stays where it is, unchanged. (Writing it again for the same
      rollout replaces it.)
    - **nothing starts in a rollout after it ended.** Once a rollout is finished (succeeded, failed
      or timeout), a span that started after its ``end_time`` is dropped: a sync agent left running
      past its timeout cannot add rewards or calls to it. Spans that started before the end are
      kept even when they arrive later (a batch of spans flushed just after the rollout finished).
      Times are compared as recorded, so hosts that send spans need clocks that agree (NTP).
      (:meth:`set_reward` is the trainer's: it may still set any rollout's reward, such as the
      reward it gives failed ones.)

    A backend implements :meth:`get_rollout`, :meth:`rollouts`, :meth:`add_spans`, :meth:`spans` and
    the rollout-record hooks :meth:`insert_rollout` and :meth:`update_rollout` (and
    :meth:`rollout_for_update` when it buffers writes); ``start_rollout``, ``finish_rollout`` and
    ``set_reward`` are written on those hooks. A store that wraps another forwards the hooks to it.

    >>> import agentlightning_lite as agl
    >>> with agl.MemoryStore() as store:  # or agl.SQLiteStore("runs.db"): the same methods
    ...     ro = store.start_rollout({"q": "2+2?"}, mode="train")
    ...     done = store.finish_rollout(ro.rollout_id, status="succeeded", reward=1.0)
    ...     [(r.mode, r.status, r.reward) for r in store.rollouts(mode="train")]
    [('train', 'succeeded', 1.0)]
    """

    # -- rollouts -------------------------------------------------------------------------
    def start_rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> Rollout:
        """Create a ``running`` rollout for ``task`` and return it.

        The process that starts it is recorded in ``metadata["agl.owner"]`` (pid and host name),
        unless the metadata names an owner already: a rollout left ``running`` by a process that
        died can then be told apart (see :mod:`agentlightning_lite.store.recovery`).
        """
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
        if rollout_id is not None and self.get_rollout(rollout_id) is not None:
            raise RolloutExistsError(f"rollout {rollout_id!r} exists already")
        rollout = Rollout(
            rollout_id=rollout_id or new_rollout_id(),
            task=task,
            mode=mode,  # type: ignore[arg-type]
            status="running",
            start_time=time.time(),
            metadata={**(metadata or {}), OWNER_KEY: (metadata or {}).get(OWNER_KEY) or owner()},
        )
        self.insert_rollout(rollout)
        return rollout

    def finish_rollout(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        only_if_running: bool = False,
    ) -> Rollout:
        """Mark a rollout finished with ``status`` and its final ``reward``; return it.

        Raises ``ValueError`` for a NaN/inf reward or an unknown status,
        :class:`~agentlightning_lite.errors.UnknownRolloutError` (a ``KeyError``) for an unknown
        rollout. A ``reward`` of ``None`` keeps any reward already recorded. With
        ``only_if_running``, a rollout finished already (e.g. marked ``timeout``) stays as it is.
        """
        if status not in ROLLOUT_STATUSES or status == "running":
            raise ValueError(f"status must be one of succeeded/failed/timeout, got {status!r}")
        reward = check_reward(reward)
        rollout = self.rollout_for_update(rollout_id)
        if rollout is None:
            raise UnknownRolloutError(rollout_id)
        if only_if_running and rollout.status != "running":
            return rollout
        update: dict[str, Any] = {"status": status, "end_time": time.time(), "error": error}
        if reward is not None:
            update["reward"] = reward
        rollout = rollout.model_copy(update=update)
        self.update_rollout(rollout)
        return rollout

    def set_reward(self, rollout_id: str, reward: float) -> None:
        """Record the final reward of a rollout without changing its status."""
        checked = check_reward(reward)
        rollout = self.rollout_for_update(rollout_id)
        if rollout is None:
            raise UnknownRolloutError(rollout_id)
        self.update_rollout(rollout.model_copy(update={"reward": checked}))

    def open_rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> str:
        """:meth:`start_rollout`, returning only the new rollout's id: the tracer's way in, for which a
        store may record the rollout without building its :class:`~agentlightning_lite.Rollout`.

        >>> import agentlightning_lite as agl
        >>> store = agl.MemoryStore()
        >>> rid = store.open_rollout({"q": "2+2?"}, mode="train")
        >>> store.get_rollout(rid).status
        'running'
        """
        return self.start_rollout(task, mode=mode, metadata=metadata, rollout_id=rollout_id).rollout_id

    def close_rollout(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        only_if_running: bool = False,
    ) -> None:
        """:meth:`finish_rollout` without the rollout back (the same checks and errors).

        >>> import agentlightning_lite as agl
        >>> store = agl.MemoryStore()
        >>> rid = store.open_rollout("task")
        >>> store.close_rollout(rid, reward=1.0)
        >>> store.get_rollout(rid).status, store.get_rollout(rid).reward
        ('succeeded', 1.0)
        """
        self.finish_rollout(
            rollout_id, status=status, reward=reward, error=error, only_if_running=only_if_running
        )

    def _own_rollout_hooks(self, base: type) -> bool:
        """Whether this store's class keeps ``base``'s rollout methods (a subclass that overrides one
        of them gets the generic :meth:`open_rollout`/:meth:`close_rollout`, which call it)."""
        cls = type(self)
        return all(getattr(cls, name) is getattr(base, name) for name in _ROLLOUT_METHODS)

    @abc.abstractmethod
    def get_rollout(self, rollout_id: str) -> Rollout | None:
        """The rollout with this id, or ``None``."""

    @abc.abstractmethod
    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        """All rollouts, oldest first, optionally filtered by mode and status."""

    # -- spans ----------------------------------------------------------------------------
    def add_span(self, span: Span) -> None:
        """Add (or replace, by ``span_id``) one span."""
        self.add_spans([span])

    @abc.abstractmethod
    def add_spans(self, spans: Iterable[Span]) -> None:
        """Add spans; a span whose ``span_id`` exists already in the same rollout replaces the stored one.

        Writes that would move a span to another rollout, or add one that started after its
        (finished) rollout ended, are dropped and logged (see the class docstring).
        """

    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        """Add spans in row form (:class:`~agentlightning_lite.store.rows.SpanRow`): the tracer's fast
        path, under the same rules as :meth:`add_spans`; stores may keep the rows as they are.

        >>> import agentlightning_lite as agl
        >>> from agentlightning_lite.store.rows import span_to_row
        >>> store = agl.MemoryStore()
        >>> ro = store.start_rollout(mode="train")
        >>> span = agl.Span(span_id="s1", rollout_id=ro.rollout_id, kind="reward", name="reward",
        ...                 start_time=ro.start_time, output=1.0)
        >>> store.add_span_rows([span_to_row(span)])
        >>> [(s.kind, s.output) for s in store.spans(ro.rollout_id)]
        [('reward', 1.0)]
        """
        self.add_spans([row_to_span(r) for r in rows])

    @abc.abstractmethod
    def spans(self, rollout_id: str) -> list[Span]:
        """The spans of one rollout, ordered by start time (then insertion order)."""

    # -- lifecycle ------------------------------------------------------------------------
    def flush(self) -> None:  # noqa: B027 - optional hook
        """Make every write so far durable (a no-op for in-memory stores)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Flush and release resources."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- rollout records: what a backend implements and a wrapper forwards -----------------
    def rollout_for_update(self, rollout_id: str) -> Rollout | None:
        """The rollout as the store holds it now, to change and write back with :meth:`update_rollout`
        (``None`` for an unknown id). Defaults to :meth:`get_rollout`; a store that buffers writes
        returns the record with its buffered changes.

        >>> import agentlightning_lite as agl
        >>> store = agl.MemoryStore()
        >>> rid = store.open_rollout("task")
        >>> store.rollout_for_update(rid).status, store.rollout_for_update("nope")
        ('running', None)
        """
        return self.get_rollout(rollout_id)

    @abc.abstractmethod
    def insert_rollout(self, rollout: Rollout) -> None:
        """Store a new rollout record as it is, unchecked: what :meth:`start_rollout` calls once it has
        built the record and made sure its id is new (begin a rollout with ``start_rollout``).

        >>> import agentlightning_lite as agl
        >>> store = agl.MemoryStore()
        >>> store.insert_rollout(agl.Rollout(rollout_id="r1", start_time=0.0))
        >>> store.get_rollout("r1").status
        'running'
        """

    @abc.abstractmethod
    def update_rollout(self, rollout: Rollout) -> None:
        """Replace the stored record of ``rollout.rollout_id`` with ``rollout`` (status, end time,
        reward, error, metadata), unchecked: what :meth:`finish_rollout` and :meth:`set_reward` call
        with a changed copy of :meth:`rollout_for_update`'s record. Span writes are judged by the
        record stored when they arrive (see the class docstring's rules).

        >>> import agentlightning_lite as agl
        >>> store = agl.MemoryStore()
        >>> ro = store.start_rollout("task")
        >>> store.update_rollout(ro.model_copy(update={"metadata": {**ro.metadata, "note": "checked"}}))
        >>> store.get_rollout(ro.rollout_id).metadata["note"]
        'checked'
        """
