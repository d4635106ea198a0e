"""What a :class:`~agentlightning_lite.store.sqlite.SQLiteStore` flush does with a batch of writes: fold
rollout updates into the inserts of the same batch, drop spans that started after their rollout ended,
write the spans in multi-row statements, find the span ids another rollout holds, and tell a full disk
from other errors; and the metadata text of the rollouts it starts."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from .._json import dumps, utf8_safe
from .base import OWNER_KEY, is_late, owner
from .rows import SpanRow
from .sqlite_schema import SPAN_COLUMNS, SPAN_UPSERT

__all__ = ["drop_late", "full_reason", "merge_updates", "moved_rows", "owner_text", "write_spans"]

_SQLITE_FULL, _SQLITE_IOERR = 13, 10
_CHUNK = 256  # span rows a statement: SQLite then inserts them in one step, without the GIL
_NCOLS = len(SPAN_COLUMNS.split(", "))
_LIMIT_VARIABLE_NUMBER = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9)
_upsert_many: dict[int, str] = {}


def _upsert_sql(n: int) -> str:
    """``SPAN_UPSERT`` for ``n`` rows in one statement (the same rows, in order, as ``n`` upserts)."""
    sql = _upsert_many.get(n)
    if sql is None:
        row = "(" + ", ".join("?" * _NCOLS) + ")"
        head, tail = SPAN_UPSERT.split(" ON CONFLICT", 1)
        sql = _upsert_many[n] = head.replace(row, ", ".join([row] * n)) + " ON CONFLICT" + tail
    return sql


def write_spans(conn: sqlite3.Connection, params: list[tuple[Any, ...]]) -> None:
    """Upsert span rows (``SPAN_UPSERT``'s parameters) in statements of up to 256 rows each.

    One statement of many rows is one ``sqlite3_step``, during which the sqlite3 module releases the
    GIL: the agent's threads run on while SQLite writes (``executemany`` takes the GIL back after
    every row). The rows go in in order, each as its own upsert would.

    >>> from .sqlite_schema import SCHEMA
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(SCHEMA) and None
    >>> rows = [(f"s{i}", "r1", None, "tool", "t", None, float(i), None, "ok", None, "null", "null", "{}",
    ...          None, None, None, None) for i in range(300)]
    >>> write_spans(conn, rows + [rows[0][:4] + ("renamed",) + rows[0][5:]])
    >>> conn.execute("SELECT count(*), min(seq), max(seq) FROM spans").fetchone()
    (300, 1, 300)
    >>> conn.execute("SELECT name FROM spans WHERE span_id = 's0'").fetchone()
    ('renamed',)
    """
    getlimit = getattr(conn, "getlimit", None)  # Python 3.11+; older SQLite allows 999 variables
    max_vars = getlimit(_LIMIT_VARIABLE_NUMBER) if getlimit else 999
    limit = max(1, min(_CHUNK, max_vars // _NCOLS))
    n = len(params)
    full = n - n % limit if limit > 1 else 0
    if full:
        sql = _upsert_sql(limit)
        for i in range(0, full, limit):
            conn.execute(sql, [v for row in params[i : i + limit] for v in row])
    if full < n:
        conn.executemany(SPAN_UPSERT, params[full:])


_owner_texts: dict[int, str] = {}  # pid -> the JSON text of {OWNER_KEY: owner()}


def owner_text() -> str:
    """The metadata text of a rollout this process starts without metadata: its owner only, the same
    text every time (made once per process).

    >>> import json
    >>> json.loads(owner_text())["agl.owner"]["pid"] == os.getpid()
    True
    """
    pid = os.getpid()
    text = _owner_texts.get(pid)
    if text is None:
        text = _owner_texts[pid] = dumps({OWNER_KEY: owner()})
    return text


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
