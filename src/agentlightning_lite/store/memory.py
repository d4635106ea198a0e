"""An in-process store: dicts behind a lock, for tests, notebooks and short runs."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from ..errors import RolloutExistsError
from ..types import Rollout, Span
from .base import Store, log_dropped
from .rows import SpanRow, row_to_span, span_to_row


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
        self._rollouts: dict[str, Rollout] = {}
        self._spans: dict[str, dict[str, Span | SpanRow]] = {}
        self._span_rollout: dict[str, str] = {}  # span id -> the rollout it belongs to
        self._ended: dict[str, float] = {}  # finished rollout id -> its end time

    def _insert_rollout(self, rollout: Rollout) -> None:
        with self._lock:
            if rollout.rollout_id in self._rollouts:
                raise RolloutExistsError(f"rollout {rollout.rollout_id!r} exists already")
            self._rollouts[rollout.rollout_id] = rollout
            self._spans.setdefault(rollout.rollout_id, {})

    def _update_rollout(self, rollout: Rollout) -> None:
        with self._lock:
            self._rollouts[rollout.rollout_id] = rollout
            if rollout.status != "running" and rollout.end_time is not None:
                self._ended[rollout.rollout_id] = rollout.end_time
            else:
                self._ended.pop(rollout.rollout_id, None)

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            return self._rollouts.get(rollout_id)

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        with self._lock:
            items = list(self._rollouts.values())
        return [
            r for r in items if (mode is None or r.mode == mode) and (status is None or r.status == status)
        ]

    def add_spans(self, spans: Iterable[Span]) -> None:
        self.add_span_rows([span_to_row(s) for s in spans])

    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        moved: list[tuple[SpanRow, str]] | None = None
        late: list[tuple[SpanRow, str, float]] | None = None
        with self._lock:
            owners, ended, buckets = self._span_rollout, self._ended, self._spans
            for r in rows:
                sid, rid = r[0], r[1]
                end = ended.get(rid)
                if end is not None and r[6] > end:  # started after its rollout ended
                    late = late or []
                    late.append((r, self._rollouts[rid].status, end))
                    continue
                stored = owners.setdefault(sid, rid)
                if stored != rid:  # a span id belongs to one rollout
                    moved = moved or []
                    moved.append((r, stored))
                    continue
                # a replaced span keeps its original position, as in SQLiteStore
                bucket = buckets.get(rid)
                if bucket is None:
                    bucket = buckets[rid] = {}
                bucket[sid] = r
        if moved or late:
            log_dropped(moved or [], late or [])

    def spans(self, rollout_id: str) -> list[Span]:
        with self._lock:
            bucket = self._spans.get(rollout_id, {})
            for key, item in bucket.items():
                if isinstance(item, tuple):  # decode once, on first read
                    bucket[key] = row_to_span(item)
            items: list[Span] = list(bucket.values())  # type: ignore[arg-type]
        # stable sort keeps insertion order among equal start times
        return sorted(items, key=lambda s: s.start_time)
