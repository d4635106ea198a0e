"""What a :class:`~agentlightning_lite.store.sqlite.SQLiteStore` flush does with a batch of writes: fold
rollout updates into the inserts of the same batch, drop spans that started after their rollout ended,
find the span ids another rollout holds, and tell a full disk from other errors."""

from __future__ import annotations

import sqlite3
from typing import Any

from .._json import utf8_safe
from .base import is_late
from .rows import SpanRow

__all__ = ["drop_late", "full_reason", "merge_updates", "moved_rows"]

_SQLITE_FULL, _SQLITE_IOERR = 13, 10


def full_reason(exc: BaseException) -> str | None:
    """What went wrong when ``exc`` means the file could not grow (full disk, size limit), else None.

    >>> full_reason(sqlite3.OperationalError("database or disk is full"))
    'the disk is full, or the file reached its size limit'
    >>> full_reason(sqlite3.OperationalError("no such table: x")) is None
    True
    """
    if not isinstance(exc, sqlite3.Error):
        return None
    code = getattr(exc, "sqlite_errorcode", None)
    primary = None if code is None else code & 0xFF
    text = str(exc)
    if primary == _SQLITE_FULL or "disk is full" in text:
        return "the disk is full, or the file reached its size limit"
    if primary == _SQLITE_IOERR or "disk I/O error" in text:
        return "a disk I/O error: is the disk full, or the file over a size limit?"
    return None


def merge_updates(
    inserts: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Fold updates of rollouts inserted in the same batch into their insert rows.

    >>> inserts = [("r1", "null", "train", "running", 1.0, None, None, "{}", None)]
    >>> updates = [("succeeded", 2.0, 1.0, None, "{}", "r1"), ("failed", 3.0, None, "x", "{}", "r0")]
    >>> merged, rest = merge_updates(inserts, updates)
    >>> merged
    [('r1', 'null', 'train', 'succeeded', 1.0, 2.0, 1.0, '{}', None)]
    >>> rest
    [('failed', 3.0, None, 'x', '{}', 'r0')]
    """
    if not inserts or not updates:
        return inserts, updates
    index = {row[0]: i for i, row in enumerate(inserts)}
    merged = list(inserts)
    rest = []
    for update in updates:
        status, end_time, reward, error, metadata, rollout_id = update
        i = index.get(rollout_id)
        if i is None:
            rest.append(update)
        else:
            r = merged[i]
            merged[i] = (r[0], r[1], r[2], status, r[4], end_time, reward, metadata, error)
    return merged, rest


def drop_late(
    conn: sqlite3.Connection, rows: list[SpanRow]
) -> tuple[list[SpanRow], list[tuple[SpanRow, str, float]]]:
    """Split a span batch into the rows to write and those that started after their rollout ended.

    >>> from .sqlite_schema import SCHEMA
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(SCHEMA) and None
    >>> _ = conn.execute(
    ...     "INSERT INTO rollouts VALUES ('r1', 'null', 'train', 'succeeded', 1.0, 2.0, 1.0, '{}', NULL)"
    ... )
    >>> row = SpanRow("s1", "r1", None, "reward", "reward", None, 3.0, 3.0, "ok", None, "null", "1", "{}",
    ...               None, None, None, None)
    >>> keep, late = drop_late(conn, [row, row._replace(span_id="s0", start_time=1.5)])
    >>> [r.span_id for r in keep], [(r.span_id, status, end) for r, status, end in late]
    (['s0'], [('s1', 'succeeded', 2.0)])
    """
    raw = {rid: utf8_safe(rid) for rid in {r[1] for r in rows}}  # each rollout id, as the table holds it
    ids = list(set(raw.values()))
    ended: dict[str, tuple[str, float]] = {}
    for i in range(0, len(ids), 500):
        chunk = ids[i : i + 500]
        ended.update(
            (rid, (status, end))
            for rid, status, end in conn.execute(
                "SELECT rollout_id, status, end_time FROM rollouts WHERE status != 'running' "
                f"AND end_time IS NOT NULL AND rollout_id IN ({', '.join('?' * len(chunk))})",
                chunk,
            )
        )
    if not ended:
        return rows, []
    by_raw = {rid: ended[db_id] for rid, db_id in raw.items() if db_id in ended}
    keep, late = [], []
    for r in rows:
        e = by_raw.get(r[1])
        if e is not None and is_late(r[6], *e):
            late.append((r, *e))
        else:
            keep.append(r)
    return keep, late


def moved_rows(conn: sqlite3.Connection, rows: list[SpanRow]) -> list[tuple[SpanRow, str]]:
    """The rows of a written batch whose span id is stored under another rollout (refused).

    >>> conn = sqlite3.connect(":memory:")
    >>> _ = conn.execute("CREATE TABLE spans (span_id TEXT, rollout_id TEXT)")
    >>> _ = conn.execute("INSERT INTO spans VALUES ('s1', 'r1')")
    >>> row = SpanRow("s1", "r2", None, "tool", "t", None, 1.0, 1.0, "ok", None, "null", "null", "{}",
    ...               None, None, None, None)
    >>> [(r.span_id, stored) for r, stored in moved_rows(conn, [row, row._replace(rollout_id="r1")])]
    [('s1', 'r1')]
    """
    out = []
    for r in rows:
        stored = conn.execute("SELECT rollout_id FROM spans WHERE span_id = ?", (utf8_safe(r[0]),)).fetchone()
        if stored is not None and stored[0] != utf8_safe(r[1]):
            out.append((r, stored[0]))
    return out
