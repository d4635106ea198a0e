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
from .sqlite_schema import ROLLOUT_INSERT, ROLLOUT_UPDATE, SPAN_UPSERT

__all__ = [
    "drop_late",
    "full_reason",
    "merge_updates",
    "moved_rows",
    "owner_text",
    "write_many",
    "write_rollouts",
    "write_spans",
]

_SQLITE_FULL, _SQLITE_IOERR = 13, 10
_CHUNK = 256  # rows a statement: SQLite then inserts them in one step, without the GIL
_LIMIT_VARIABLE_NUMBER = getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9)
_many: dict[tuple[str, int], str] = {}
# UPDATE ... FROM (SQLite 3.33+): a batch's rollout updates in one statement
_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)
_ROLLOUT_UPDATE_MANY = (
    "UPDATE rollouts SET status = v.column1, end_time = v.column2, reward = v.column3, error = v.column4, "
    "metadata = v.column5 FROM (VALUES {rows}) AS v WHERE rollouts.rollout_id = v.column6"
)


def _many_sql(sql: str, n: int) -> str:
    """``sql`` (one ``VALUES`` group of ``?``, or ``{rows}`` in its place) for ``n`` rows in one statement."""
    key = (sql, n)
    many = _many.get(key)
    if many is None:
        if "{rows}" in sql:
            ncols = 6
            many = sql.format(rows=", ".join(["(" + ", ".join("?" * ncols) + ")"] * n))
        else:
            values = sql[sql.index("VALUES (") + 7 :]
            row = values[: values.index(")") + 1]
            many = sql.replace(row, ", ".join([row] * n), 1)
        _many[key] = many
    return many


def write_many(conn: sqlite3.Connection, sql: str, params: list[tuple[Any, ...]]) -> None:
    """Run ``sql`` (an ``INSERT ... VALUES (?, ...)``) once per row of ``params``, in order, as statements
    of up to 256 rows each (then 128, 64, ... for the rest: a few statement shapes, each prepared once).

    One statement of many rows is one ``sqlite3_step``, during which the sqlite3 module releases the
    GIL, and takes it back once. ``executemany`` takes it back after every row: each time it waits
    for the agent's threads to hand it over (up to the interpreter's switch interval, 5 ms), so a
    writer thread writing row by row falls behind the agents that feed it.

    >>> conn = sqlite3.connect(":memory:")
    >>> _ = conn.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
    >>> write_many(conn, "INSERT INTO t (a, b) VALUES (?, ?) ON CONFLICT(a) DO NOTHING",
    ...            [(i, str(i)) for i in range(300)] + [(0, "again")])
    >>> conn.execute("SELECT count(*), max(a) FROM t").fetchone()
    (300, 299)
    >>> conn.execute("SELECT b FROM t WHERE a = 0").fetchone()
    ('0',)
    """
    if not params:
        return
    getlimit = getattr(conn, "getlimit", None)  # Python 3.11+; older SQLite allows 999 variables
    max_vars = getlimit(_LIMIT_VARIABLE_NUMBER) if getlimit else 999
    limit = max(1, min(_CHUNK, max_vars // len(params[0])))
    i, n = 0, len(params)
    while i < n:
        size = limit
        while size > n - i:
            size //= 2
        if size <= 1:
            conn.execute(sql if "{rows}" not in sql else _many_sql(sql, 1), params[i])
            i += 1
            continue
        conn.execute(_many_sql(sql, size), [v for row in params[i : i + size] for v in row])
        i += size


def write_spans(conn: sqlite3.Connection, params: list[tuple[Any, ...]]) -> None:
    """Upsert span rows (``SPAN_UPSERT``'s parameters) in multi-row statements (:func:`write_many`).

    The rows go in in order, each as its own upsert would.

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
    write_many(conn, SPAN_UPSERT, params)


def write_rollouts(
    conn: sqlite3.Connection, inserts: list[tuple[Any, ...]], updates: list[tuple[Any, ...]]
) -> None:
    """Insert rollouts (``ROLLOUT_INSERT``'s parameters: a rollout id already there is left as it is),
    then apply updates (``ROLLOUT_UPDATE``'s), both in multi-row statements; for a rollout updated
    more than once, the last update is the one that stays, as when applied one by one.

    >>> from .sqlite_schema import SCHEMA
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(SCHEMA) and None
    >>> write_rollouts(conn, [(f"r{i}", "null", "train", "running", 1.0, None, None, "{}", None)
    ...                       for i in range(3)], [("failed", 2.0, None, "x", "{}", "r1"),
    ...                                             ("succeeded", 3.0, 1.0, None, "{}", "r1")])
    >>> conn.execute("SELECT rollout_id, status, reward FROM rollouts ORDER BY rollout_id").fetchall()
    [('r0', 'running', None), ('r1', 'succeeded', 1.0), ('r2', 'running', None)]
    """
    if inserts:
        write_many(conn, ROLLOUT_INSERT, inserts)
    if not updates:
        return
    if not _UPDATE_FROM:
        conn.executemany(ROLLOUT_UPDATE, updates)
        return
    last = {u[5]: u for u in updates}  # each update sets every column it touches: the last one stays
    write_many(conn, _ROLLOUT_UPDATE_MANY, list(last.values()))


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
