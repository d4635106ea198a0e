"""An in-process store: dicts behind a lock, for tests, notebooks and short runs."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from ..errors import RolloutExistsError, UnknownRolloutError
from ..ids import new_rollout_id
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, TRUSTED, Rollout, Span, check_reward
from .base import Store, log_dropped, rollout_payload
from .rows import SpanRow, row_to_span, span_to_row

_Dropped = tuple[list[tuple[SpanRow, str]], list[tuple[SpanRow, str, float]]]

#: pending span rows that make the next write file them (see MemoryStore._pending)
_FILE_AT = 256

# A rollout the tracer started is kept as a tuple until it is read (then as its Rollout):
# (rollout_id, task, mode, status, start_time, end_time, reward, metadata, error), task and metadata
# copied already.
_RolloutRow = tuple[str, Any, str, str, float, "float | None", "float | None", dict[str, Any], "str | None"]


def _decode(r: _RolloutRow) -> Rollout:
    fields: dict[str, Any] = {
        "rollout_id": r[0],
        "task": r[1],
        "mode": r[2],
        "status": r[3],
        "start_time": r[4],
        "metadata": r[7],
    }
    if r[3] != "running":  # as finish_rollout's model_copy(update=...) would set them
        fields["end_time"], fields["error"] = r[5], r[8]
    if r[6] is not None:
        fields["reward"] = r[6]
    return Rollout.model_validate(fields, context=TRUSTED)


class MemoryStore(Store):
    """Keeps rollouts and spans in memory; nothing survives the process.

    >>> import agentlightning_lite as agl
    >>> store = agl.MemoryStore()
    >>> tracer = agl.Tracer(store)
    >>> with tracer.rollout({"q": "2+2"}) as ro:
    ...     with tracer.span("tool", "calculator", input="2+2") as sp:
    ...         sp.set_output(4)
    ...     ro.reward(1.0)
    >>> [s.name for s in store.spans(ro.id)], store.get_rollout(ro.id).reward
    (['calculator', 'reward'], 1.0)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rollouts: dict[str, Rollout | _RolloutRow] = {}
        self._spans: dict[str, dict[str, Span | SpanRow]] = {}
        self._span_rollout: dict[str, str] = {}  # span id -> the rollout it belongs to
        self._ended: dict[str, float] = {}  # finished rollout id -> its end time
        # Span rows written and not yet filed: add_span_rows only appends here (deque.extend is
        # atomic, so without the lock), and the rows are filed in order, under the rules, before any
        # read of spans and before any change to a rollout's end or status (what the rules judge by),
        # so each is judged as it would have been when written.
        self._pending: deque[SpanRow] = deque()
        self._fast = self._own_rollout_hooks(MemoryStore)

    def open_rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> str:
        if not self._fast or (rollout_id is not None and type(rollout_id) is not str):
            return super().open_rollout(task, mode, metadata, rollout_id)
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
        rid = rollout_id or new_rollout_id()
        task, meta = rollout_payload(task, metadata)
        with self._lock:
            if rid in self._rollouts:
                raise RolloutExistsError(f"rollout {rid!r} exists already")
            self._rollouts[rid] = (rid, task, mode, "running", time.time(), None, None, meta, None)
        return rid

    def close_rollout(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        only_if_running: bool = False,
    ) -> None:
        if self._fast:
            if status not in ROLLOUT_STATUSES or status == "running":
                raise ValueError(f"status must be one of succeeded/failed/timeout, got {status!r}")
            reward = check_reward(reward)
            dropped = None
            with self._lock:
                r = self._rollouts.get(rollout_id)
                if r is None:
                    raise UnknownRolloutError(rollout_id)
                if type(r) is tuple and not (only_if_running and r[3] != "running"):
                    if self._pending:
                        dropped = self._file_pending()
                    end = time.time()
                    self._rollouts[rollout_id] = (
                        *r[:3],
                        status,
                        r[4],
                        end,
                        r[6] if reward is None else reward,
                        r[7],
                        error,
                    )
                    self._ended[rollout_id] = end
            if dropped:
                log_dropped(*dropped)
            if type(r) is tuple:
                return
        super().close_rollout(rollout_id, status, reward, error, only_if_running)

    def _decoded(self, r: Rollout | _RolloutRow) -> Rollout:
        """The rollout ``r`` as a Rollout (a row is decoded on its first read); call with the lock held."""
        if isinstance(r, Rollout):
            return r
        ro = self._rollouts[r[0]] = _decode(r)
        return ro

    def insert_rollout(self, rollout: Rollout) -> None:
        with self._lock:
            if rollout.rollout_id in self._rollouts:
                raise RolloutExistsError(f"rollout {rollout.rollout_id!r} exists already")
            self._rollouts[rollout.rollout_id] = rollout
            self._spans.setdefault(rollout.rollout_id, {})

    def update_rollout(self, rollout: Rollout) -> None:
        with self._lock:
            dropped = self._file_pending() if self._pending else None
            self._rollouts[rollout.rollout_id] = rollout
            if rollout.status != "running" and rollout.end_time is not None:
                self._ended[rollout.rollout_id] = rollout.end_time
            else:
                self._ended.pop(rollout.rollout_id, None)
        if dropped:
            log_dropped(*dropped)

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            r = self._rollouts.get(rollout_id)
            return None if r is None else self._decoded(r)

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        with self._lock:
            items = [self._decoded(r) for r in list(self._rollouts.values())]
        return [
            r for r in items if (mode is None or r.mode == mode) and (status is None or r.status == status)
        ]

    def add_spans(self, spans: Iterable[Span]) -> None:
        self.add_span_rows([span_to_row(s) for s in spans])

    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        pending = self._pending
        pending.extend(rows)
        if len(pending) >= _FILE_AT:  # filed now and then even with no reads: refusals are logged soon
            with self._lock:
                dropped = self._file_pending()
            if dropped:
                log_dropped(*dropped)

    def _file_pending(self) -> _Dropped | None:
        """File the pending span rows under the store's rules; call with the lock held, and log what it
        returns (the refused writes) once the lock is released."""
        moved: list[tuple[SpanRow, str]] | None = None
        late: list[tuple[SpanRow, str, float]] | None = None
        owners, ended, buckets, pending = self._span_rollout, self._ended, self._spans, self._pending
        popleft = pending.popleft
        last: str | None = None  # the rollout of the row before (rows of one rollout come in runs)
        end: float | None = None
        bucket: dict[str, Span | SpanRow] = {}
        while pending:  # writers may append meanwhile: their rows are filed too, in order
            r = popleft()
            sid, rid = r[0], r[1]
            if rid != last:
                last, end = rid, ended.get(rid)
                bucket = buckets.get(rid)  # type: ignore[assignment]
                if bucket is None:
                    bucket = buckets[rid] = {}
            if end is not None and r[6] > end:  # started after its rollout ended
                late = late or []
                ro = self._rollouts[rid]
                late.append((r, ro[3] if type(ro) is tuple else ro.status, end))  # type: ignore[union-attr]
                continue
            stored = owners.setdefault(sid, rid)
            if stored != rid:  # a span id belongs to one rollout
                moved = moved or []
                moved.append((r, stored))
                continue
            bucket[sid] = r  # a replaced span keeps its original position, as in SQLiteStore
        return (moved or [], late or []) if moved or late else None

    def spans(self, rollout_id: str) -> list[Span]:
        with self._lock:
            dropped = self._file_pending() if self._pending else None
            bucket = self._spans.get(rollout_id, {})
            for key, item in bucket.items():
                if isinstance(item, tuple):  # decode once, on first read
                    bucket[key] = row_to_span(item)
            items: list[Span] = list(bucket.values())  # type: ignore[arg-type]
        if dropped:
            log_dropped(*dropped)
        # stable sort keeps insertion order among equal start times
        return sorted(items, key=lambda s: s.start_time)
