"""A durable store in one SQLite file: WAL mode, batched commits, safe across threads and processes."""

from __future__ import annotations

import atexit
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .._json import dumps, loads
from ..types import Rollout, Span
from .base import Store

#: ``PRAGMA application_id`` of files written by this package ("AGLL").
APPLICATION_ID = 0x41474C4C
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (
    rollout_id TEXT PRIMARY KEY,
    task       TEXT,            -- JSON
    mode       TEXT NOT NULL,
    status     TEXT NOT NULL,
    start_time REAL NOT NULL,
    end_time   REAL,
    reward     REAL,
    metadata   TEXT NOT NULL,   -- JSON object
    error      TEXT
);
CREATE INDEX IF NOT EXISTS rollouts_mode_status ON rollouts(mode, status);
CREATE TABLE IF NOT EXISTS spans (
    seq                INTEGER PRIMARY KEY AUTOINCREMENT,
    span_id            TEXT NOT NULL UNIQUE,
    rollout_id         TEXT NOT NULL,
    parent_id          TEXT,
    kind               TEXT NOT NULL,
    name               TEXT NOT NULL,
    agent              TEXT,
    start_time         REAL NOT NULL,
    end_time           REAL,
    status             TEXT NOT NULL,
    error              TEXT,
    input              TEXT,    -- JSON
    output             TEXT,    -- JSON
    attributes         TEXT NOT NULL,  -- JSON object
    model              TEXT,
    prompt_token_ids   TEXT,    -- JSON array of ints
    response_token_ids TEXT,    -- JSON array of ints
    response_logprobs  TEXT     -- JSON array of floats
);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans(rollout_id, start_time);
"""

_SPAN_COLUMNS = (
    "span_id, rollout_id, parent_id, kind, name, agent, start_time, end_time, status, error, "
    "input, output, attributes, model, prompt_token_ids, response_token_ids, response_logprobs"
)
_SPAN_UPSERT = (
    f"INSERT INTO spans ({_SPAN_COLUMNS}) VALUES ({', '.join('?' * 17)}) "
    "ON CONFLICT(span_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _SPAN_COLUMNS.split(", ")[1:])
)
_ROLLOUT_COLUMNS = "rollout_id, task, mode, status, start_time, end_time, reward, metadata, error"


class NotOurDatabase(ValueError):
    """The file is a SQLite database written by something else, or not a database at all."""


def _span_row(s: Span) -> tuple[Any, ...]:
    return (
        s.span_id,
        s.rollout_id,
        s.parent_id,
        s.kind,
        s.name,
        s.agent,
        s.start_time,
        s.end_time,
        s.status,
        s.error,
        dumps(s.input),
        dumps(s.output),
        dumps(s.attributes),
        s.model,
        None if s.prompt_token_ids is None else dumps(s.prompt_token_ids),
        None if s.response_token_ids is None else dumps(s.response_token_ids),
        None if s.response_logprobs is None else dumps(s.response_logprobs),
    )


def _row_span(r: tuple[Any, ...]) -> Span:
    return Span.model_construct(
        span_id=r[0],
        rollout_id=r[1],
        parent_id=r[2],
        kind=r[3],
        name=r[4],
        agent=r[5],
        start_time=r[6],
        end_time=r[7],
        status=r[8],
        error=r[9],
        input=loads(r[10]),
        output=loads(r[11]),
        attributes=loads(r[12]),
        model=r[13],
        prompt_token_ids=loads(r[14]),
        response_token_ids=loads(r[15]),
        response_logprobs=loads(r[16]),
    )


def _rollout_row(r: Rollout) -> tuple[Any, ...]:
    return (
        r.rollout_id,
        dumps(r.task),
        r.mode,
        r.status,
        r.start_time,
        r.end_time,
        r.reward,
        dumps(r.metadata),
        r.error,
    )


def _row_rollout(r: tuple[Any, ...]) -> Rollout:
    return Rollout.model_construct(
        rollout_id=r[0],
        task=loads(r[1]),
        mode=r[2],
        status=r[3],
        start_time=r[4],
        end_time=r[5],
        reward=r[6],
        metadata=loads(r[7]),
        error=r[8],
    )


class SQLiteStore(Store):
    """Rollouts and spans in a SQLite file that any process can open while others write.

    Spans are buffered and committed in batches: when ``batch_size`` spans are pending, every
    ``flush_interval`` seconds (a background thread), before any read, and on ``close()``.
    Rollout starts and finishes commit at once. The file is in WAL mode, so readers never block
    writers; several processes may write the same file. A process killed mid-stream loses at most
    its uncommitted batch; the file stays valid.

    >>> import tempfile, os, agentlightning_lite as agl
    >>> path = os.path.join(tempfile.mkdtemp(), "runs.db")
    >>> with agl.SQLiteStore(path) as store:
    ...     tracer = agl.Tracer(store)
    ...     with tracer.rollout("task-1") as ro:
    ...         ro.reward(0.5)
    >>> agl.SQLiteStore(path).get_rollout(ro.id).reward
    0.5
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_size: int = 256,
        flush_interval: float = 0.2,
        timeout: float = 60.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.path = Path(path)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.timeout = timeout
        self._lock = threading.RLock()
        self._pending: list[Span] = []
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._open()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if flush_interval > 0:
            self._start_flusher()
        _open_stores.add(self)

    # -- connection -----------------------------------------------------------------------
    def _open(self) -> None:
        if self.path.parent and not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            str(self.path), timeout=self.timeout, check_same_thread=False, isolation_level=None
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            app_id = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {
                r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise NotOurDatabase(f"{self.path} is not a SQLite database ({exc})") from None
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables - {"sqlite_sequence"}):
            conn.close()
            raise NotOurDatabase(
                f"{self.path} is a SQLite database, but not an agentlightning-lite store"
            )
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable across process crashes in WAL mode
        if app_id == 0:
            self._write(conn, lambda c: c.executescript(
                "BEGIN IMMEDIATE;" + _SCHEMA
                + f"PRAGMA application_id = {APPLICATION_ID};"
                + f"PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
            ), script=True)
        self._conn = conn

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError(f"SQLiteStore({str(self.path)!r}) is closed")
        if os.getpid() != self._pid:  # forked child: never share the parent's connection
            self._pid = os.getpid()
            self._pending = []
            self._lock = threading.RLock()
            self._open()
            if self.flush_interval > 0:
                self._start_flusher()
        assert self._conn is not None
        return self._conn

    def _write(self, conn: sqlite3.Connection, fn: Any, script: bool = False) -> None:
        """Run ``fn(conn)`` in one IMMEDIATE transaction, retrying while another process writes."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                if script:
                    fn(conn)
                    return
                conn.execute("BEGIN IMMEDIATE")
                try:
                    fn(conn)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _start_flusher(self) -> None:
        self._stop = threading.Event()
        ref = weakref.ref(self)
        stop = self._stop
        interval = self.flush_interval

        def loop() -> None:
            while not stop.wait(interval):
                store = ref()
                if store is None:
                    return
                try:
                    store.flush()
                except Exception:  # the next flush, a read or close() surfaces the error
                    pass
                del store

        self._flusher = threading.Thread(target=loop, name="agl-sqlite-flush", daemon=True)
        self._flusher.start()

    # -- writes ---------------------------------------------------------------------------
    def _flush_locked(self, conn: sqlite3.Connection, extra: Any = None) -> None:
        pending = self._pending
        if not pending and extra is None:
            return
        rows = [_span_row(s) for s in pending]

        def tx(c: sqlite3.Connection) -> None:
            if extra is not None:
                extra(c)
            if rows:
                c.executemany(_SPAN_UPSERT, rows)

        self._write(conn, tx)
        self._pending = []

    def flush(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._flush_locked(self._connection())

    def add_spans(self, spans: Iterable[Span]) -> None:
        with self._lock:
            conn = self._connection()
            self._pending.extend(spans)
            if len(self._pending) >= self.batch_size:
                self._flush_locked(conn)

    def _insert_rollout(self, rollout: Rollout) -> None:
        row = _rollout_row(rollout)
        with self._lock:
            conn = self._connection()
            try:
                self._flush_locked(
                    conn,
                    lambda c: c.execute(
                        f"INSERT INTO rollouts ({_ROLLOUT_COLUMNS}) VALUES ({', '.join('?' * 9)})",
                        row,
                    ),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"rollout {rollout.rollout_id!r} exists already") from None

    def _update_rollout(self, rollout: Rollout) -> None:
        row = _rollout_row(rollout)
        with self._lock:
            self._flush_locked(
                self._connection(),
                lambda c: c.execute(
                    "UPDATE rollouts SET task = ?, mode = ?, status = ?, start_time = ?, "
                    "end_time = ?, reward = ?, metadata = ?, error = ? WHERE rollout_id = ?",
                    row[1:] + row[:1],
                ),
            )

    # -- reads ----------------------------------------------------------------------------
    def _query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._connection()
            self._flush_locked(conn)
            return conn.execute(sql, params).fetchall()

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        rows = self._query(
            f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,)
        )
        return _row_rollout(rows[0]) if rows else None

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        where, params = [], []
        if mode is not None:
            where.append("mode = ?")
            params.append(mode)
        if status is not None:
            where.append("status = ?")
            params.append(status)
        sql = f"SELECT {_ROLLOUT_COLUMNS} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY start_time, rowid"
        return [_row_rollout(r) for r in self._query(sql, tuple(params))]

    def spans(self, rollout_id: str) -> list[Span]:
        rows = self._query(
            f"SELECT {_SPAN_COLUMNS} FROM spans WHERE rollout_id = ? ORDER BY start_time, seq",
            (rollout_id,),
        )
        return [_row_span(r) for r in rows]

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._stop.set()
            try:
                if os.getpid() == self._pid:
                    self._flush_locked(self._connection())
            finally:
                self._closed = True
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
        _open_stores.discard(self)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"


_open_stores: weakref.WeakSet[SQLiteStore] = weakref.WeakSet()


@atexit.register
def _flush_all_at_exit() -> None:
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:  # the interpreter is exiting; nothing left to report to
            pass
