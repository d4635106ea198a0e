"""A durable store in one SQLite file: WAL mode, batched commits, safe across threads and processes."""

from __future__ import annotations

import atexit
import logging
import os
import sqlite3
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from .._json import dumps, utf8_safe
from ..ids import new_rollout_id
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, Rollout, Span, check_reward
from . import sqlite_batch as batch
from .base import Store, log_dropped, rollout_payload
from .rows import SpanRow, row_to_span, span_to_row
from .sqlite_schema import (  # the file format; these names are importable from here too
    APPLICATION_ID,
    ROLLOUT_COLUMNS,
    ROLLOUT_INSERT,  # noqa: F401 - importable from here, as the comment above says
    ROLLOUT_UPDATE,  # noqa: F401 - importable from here, as the comment above says
    SCHEMA,
    SCHEMA_VERSION,
    SPAN_COLUMNS,
    SPAN_UPSERT,  # noqa: F401 - importable from here, as the comment above says
    NotOurDatabase,
    check_schema,
    db_row,
    db_row_raw,
    rollout_row,
    rollouts_sql,
    row_rollout,
)

logger = logging.getLogger(__name__)


class StoreFullError(sqlite3.OperationalError):
    """A write to a :class:`SQLiteStore` failed: its disk is full, or its file reached a size limit.

    What was committed before stays in the file. While the store is open, the writes that could not
    be committed are kept in memory and retried on the next flush (new writes are refused until one
    succeeds); on ``close()`` they are lost, and the message says how many.
    """


class SQLiteStore(Store):
    """Rollouts and spans in a SQLite file that any process can open while others write.

    Writes (spans, rollout starts and finishes) are buffered and committed in batches, each batch
    one transaction, by a background thread: when ``batch_size`` writes are pending and every
    ``flush_interval`` seconds; by the writing thread itself before any read in this process, on
    ``flush()``, on ``close()`` (also at interpreter exit), and when a second full batch waits.
    WAL mode: readers never block writers; several processes may write the same file. A process
    killed mid-stream loses at most the uncommitted batch (the writes since the last commit: at
    most ``flush_interval`` seconds of work and one full batch besides the one being filled); the
    file stays valid.

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
        batch_size: int = 512,
        flush_interval: float = 0.2,
        timeout: float = 60.0,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.path = Path(path)
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.timeout = timeout
        self._closed = False
        self._conn: sqlite3.Connection | None = None
        self._fast = self._own_rollout_hooks(SQLiteStore)
        self._init_process_state()
        _open_stores.add(self)

    def _init_process_state(self) -> None:
        """Connection, queues, locks and writer thread: what a forked child must not share."""
        self._pid = os.getpid()
        self._forked = False  # set in a forked child (see _after_fork)
        self._lock = threading.Lock()  # guards the queues and _live (held briefly)
        self._wlock = threading.RLock()  # guards the connection; taken before _lock, never after
        self._inserts: list[tuple[Any, ...]] = []
        self._rows: list[SpanRow] = []
        self._updates: list[tuple[Any, ...]] = []
        # rollouts started here and still running: the Rollout, or the row open_rollout queued
        self._live: dict[str, Rollout | tuple[Any, ...]] = {}
        self._error: BaseException | None = None  # the background flush's last failure
        self._open()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        if self.flush_interval > 0:
            self._start_flusher()

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
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise NotOurDatabase(f"{self.path} is not a SQLite database ({exc})") from None
        if app_id not in (0, APPLICATION_ID) or (app_id == 0 and tables):
            conn.close()
            raise NotOurDatabase(f"{self.path} is a SQLite database, but not an agentlightning-lite store")
        if app_id == APPLICATION_ID:
            try:
                check_schema(conn, self.path)
            except NotOurDatabase:
                conn.close()
                raise
        if app_id == 0:
            conn.execute("PRAGMA page_size = 16384")  # fewer, larger pages for span rows
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")  # durable across process crashes in WAL mode
        conn.execute("PRAGMA cache_size = -16384")  # 16 MiB of page cache for batched writes
        if app_id == 0:
            try:
                self._transaction(conn, lambda c: self._create_schema(c))
            except sqlite3.Error as exc:
                conn.close()
                full = batch.full_reason(exc)
                if full is None:
                    raise
                raise StoreFullError(
                    f"cannot create a store in {self.path}: {full} (sqlite3: {exc})"
                ) from exc
        self._conn = conn

    @staticmethod
    def _create_schema(conn: sqlite3.Connection) -> None:
        if conn.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID:
            return  # another process created it while we waited for the lock
        for statement in SCHEMA.split(";"):
            if statement.strip():
                conn.execute(statement)
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def _connection(self) -> sqlite3.Connection:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._forked:  # forked child: never use the parent's connection or queues
            self._init_process_state()
        assert self._conn is not None
        return self._conn

    def _transaction(self, conn: sqlite3.Connection, fn: Any) -> None:
        """Run ``fn(conn)`` in one IMMEDIATE transaction, retrying while another process writes."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if ("locked" in str(exc) or "busy" in str(exc)) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise
            try:
                fn(conn)
                conn.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled back already (a full disk does): keep the original error
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise
            return

    def _start_flusher(self) -> None:
        ref = weakref.ref(self)
        wake, stop, interval = self._wake, self._stop, self.flush_interval

        def loop() -> None:
            while not stop.is_set():
                wake.wait(interval)
                wake.clear()
                store = ref()
                if store is None:
                    return
                try:
                    store.flush()
                except Exception as exc:  # kept queued; the next write, flush, read or close() raises it
                    if store._error is None:
                        logger.error("%s", exc)
                    store._error = exc
                del store

        self._flusher = threading.Thread(target=loop, name="agl-sqlite-writer", daemon=True)
        self._flusher.start()

    # -- writes ---------------------------------------------------------------------------
    # Pending writes wait in three queues (rollout inserts, span rows, rollout updates). Each flush
    # commits all three in one transaction, inserts first: a batch is all there or not at all.
    # A full batch wakes the background thread: SQLite writes the spans in multi-row statements, during
    # which the sqlite3 module releases the GIL (``executemany`` took it back after every row).
    def flush(self) -> None:
        with self._wlock:
            if self._closed:
                return
            conn = self._connection()
            with self._lock:
                inserts, spans, updates = self._inserts, self._rows, self._updates
                self._inserts, self._rows, self._updates = [], [], []
            if not (inserts or spans or updates):
                self._error = None
                return

            inserts, updates = batch.merge_updates(inserts, updates)

            dropped: list[Any] = []

            def tx(c: sqlite3.Connection) -> None:
                dropped.clear()  # a retried transaction starts over
                # rollout updates before spans: a span queued after its rollout finished is judged
                # against the finished rollout (spans that started before the end pass either way)
                batch.write_rollouts(c, inserts, updates)
                if spans:
                    keep, late = batch.drop_late(c, spans)
                    before = c.total_changes
                    c.execute("SAVEPOINT agl_spans")
                    try:
                        batch.write_spans(c, [db_row_raw(r) for r in keep])
                    except UnicodeEncodeError:  # text UTF-8 cannot hold (a lone surrogate): escape it
                        c.execute("ROLLBACK TO agl_spans")
                        before = c.total_changes
                        batch.write_spans(c, [db_row(r) for r in keep])
                    c.execute("RELEASE agl_spans")
                    moved = batch.moved_rows(c, keep) if c.total_changes - before < len(keep) else []
                    if moved or late:
                        dropped.append((moved, late))

            try:
                self._transaction(conn, tx)
            except BaseException as exc:
                with self._lock:  # nothing is lost: the batch goes back to the front of the queues
                    self._inserts[:0], self._rows[:0], self._updates[:0] = inserts, spans, updates
                    pending = len(self._inserts) + len(self._rows) + len(self._updates)
                full = batch.full_reason(exc)
                if full is None:
                    raise
                raise StoreFullError(
                    f"cannot write to {self.path}: {full} (sqlite3: {exc}); "
                    f"what was committed before is kept; {pending} write(s) not committed are kept in "
                    "memory and retried on the next flush "
                    "(free some space, or close() to give them up)"
                ) from exc
            self._error = None
        if dropped:
            log_dropped(*dropped[0])

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")
        if self._forked:
            with self._wlock:
                self._connection()
        if self._error is not None:  # the background flush failed: retry now, refuse the write if it fails
            self.flush()

    def add_spans(self, spans: Iterable[Span]) -> None:
        self.add_span_rows([span_to_row(s) for s in spans])

    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        if self._closed or self._forked or self._error is not None:
            self._check_open()
        with self._lock:
            self._rows.extend(rows)
            pending = len(self._rows)
        if pending >= self.batch_size:
            self._batch_full(pending)

    def _batch_full(self, pending: int) -> None:  # the writer thread commits it, unless a batch behind
        if self._flusher is None or pending >= 2 * self.batch_size:
            self.flush()
        elif not self._wake.is_set():
            self._wake.set()

    def open_rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> str:
        if not self._fast or rollout_id is not None:  # a given id: start_rollout checks it is new
            return super().open_rollout(task, mode, metadata, rollout_id)
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
        self._check_open()
        rid = new_rollout_id()
        # the row start_rollout would queue (rollout_row of its Rollout), without the Rollout; the task's
        # text is that of its JSON-safe copy, and without metadata the owner's text is the same each time
        meta = dumps(rollout_payload(None, metadata)[1]) if metadata else batch.owner_text()
        row = (rid, dumps(task), mode, "running", time.time(), None, None, meta, None)
        with self._lock:
            self._live[rid] = row
            self._inserts.append(row)
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
            self._check_open()
            full = False
            with self._lock:
                row = self._live.get(rollout_id)
                if type(row) is tuple:  # started by open_rollout and still running
                    del self._live[rollout_id]
                    self._updates.append(
                        (
                            status,
                            time.time(),
                            row[6] if reward is None else reward,
                            None if error is None else utf8_safe(error),
                            row[7],
                            row[0],
                        )
                    )
                    full = len(self._updates) >= self.batch_size
            if type(row) is tuple:
                if full:
                    self._batch_full(self.batch_size)
                return
        super().close_rollout(rollout_id, status, reward, error, only_if_running)

    def insert_rollout(self, rollout: Rollout) -> None:
        self._check_open()
        with self._lock:
            self._live[rollout.rollout_id] = rollout
            self._inserts.append(rollout_row(rollout))

    def update_rollout(self, rollout: Rollout) -> None:
        self._check_open()
        with self._lock:
            if rollout.status == "running":
                self._live[rollout.rollout_id] = rollout
            else:
                self._live.pop(rollout.rollout_id, None)
            self._updates.append(
                (
                    rollout.status,
                    rollout.end_time,
                    rollout.reward,
                    None if rollout.error is None else utf8_safe(rollout.error),
                    dumps(rollout.metadata),
                    utf8_safe(rollout.rollout_id),
                )
            )
            full = len(self._updates) >= self.batch_size
        if full:
            self.flush()

    def rollout_for_update(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            live = self._live.get(rollout_id)
        if isinstance(live, tuple):
            return row_rollout(live)
        return live if live is not None else self.get_rollout(rollout_id)

    # -- reads ----------------------------------------------------------------------------
    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a SQL statement that reads the store (after flushing its buffered writes) and return its
        rows: the web view's way in; the tables are those of :mod:`~agentlightning_lite.store.sqlite_schema`.

        >>> import os, tempfile, agentlightning_lite as agl
        >>> with agl.SQLiteStore(os.path.join(tempfile.mkdtemp(), "runs.db")) as store:
        ...     _ = store.start_rollout("2+2?", mode="train")
        ...     store.query("SELECT mode, status FROM rollouts")
        [('train', 'running')]
        """
        with self._wlock:
            self.flush()  # read your own writes
            return self._connection().execute(sql, tuple(params)).fetchall()

    def rollouts_where(self, where: str, params: Sequence[Any] = ()) -> list[Rollout]:
        """The rollouts matching ``where``, a SQL condition on the ``rollouts`` table with ``?`` marks for
        ``params``, oldest first.

        >>> import os, tempfile, agentlightning_lite as agl
        >>> with agl.SQLiteStore(os.path.join(tempfile.mkdtemp(), "runs.db")) as store:
        ...     ro = store.start_rollout("2+2?", mode="train", metadata={"step": 3})
        ...     [r.rollout_id == ro.rollout_id for r in store.rollouts_where(
        ...         "json_extract(metadata, '$.step') = ?", (3,))]
        [True]
        """
        return [row_rollout(r) for r in self.query(rollouts_sql(where), params)]

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        rows = self.query(
            f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (utf8_safe(rollout_id),)
        )
        return row_rollout(rows[0]) if rows else None

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        where, params = [], []
        for col, value in (("mode", mode), ("status", status)):
            if value is not None:
                where.append(f"{col} = ?")
                params.append(value)
        return self.rollouts_where(" AND ".join(where), params)

    def spans(self, rollout_id: str) -> list[Span]:
        rows = self.query(
            f"SELECT {SPAN_COLUMNS} FROM spans WHERE rollout_id = ? ORDER BY start_time, seq",
            (utf8_safe(rollout_id),),
        )
        return [row_to_span(r) for r in rows]

    # -- lifecycle ------------------------------------------------------------------------
    def close(self) -> None:
        with self._wlock:
            if self._closed:
                return
            self._stop.set()
            self._wake.set()
            try:
                if not self._forked:
                    self.flush()
            except StoreFullError as exc:
                with self._lock:
                    lost = len(self._inserts) + len(self._rows) + len(self._updates)
                    self._inserts, self._rows, self._updates = [], [], []
                reason = batch.full_reason(exc.__cause__ or exc) or "it is full"
                raise StoreFullError(
                    f"cannot write to {self.path}: {reason} (sqlite3: {exc.__cause__}); "
                    f"what was committed before is kept; closing it lost {lost} write(s) not committed"
                ) from exc.__cause__
            finally:
                self._closed = True
                if self._conn is not None and not self._forked:  # a child never touches the parent's
                    self._conn.close()
                self._conn = None
        _open_stores.discard(self)

    def __repr__(self) -> str:
        return f"SQLiteStore({str(self.path)!r})"


_open_stores: weakref.WeakSet[SQLiteStore] = weakref.WeakSet()


def _after_fork() -> None:
    for store in list(_open_stores):
        store._forked = True
        store._lock = threading.Lock()  # the parent's locks may have been held by another thread
        store._wlock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


@atexit.register
def close_open_stores() -> None:
    """Close every SQLite store of this process still open (at the interpreter's exit, and before a
    process ends without it: ``rl.distributed.leave_after_launch``), writing what each still holds."""
    for store in list(_open_stores):
        try:
            store.close()
        except Exception as exc:  # the interpreter is exiting: say what was lost, on stderr
            print(f"agentlightning_lite: {exc}", file=sys.stderr, flush=True)
