"""A SQLite store opened read-only: reads work, writes raise, the file is never changed (what
``agl-lite ui``, ``agl-lite runs`` and the other reading commands open)."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .._json import utf8_safe
from ..errors import AGLError
from ..types import Rollout, Span
from .base import Store
from .rows import row_to_span
from .sqlite_schema import (
    APPLICATION_ID,
    ROLLOUT_COLUMNS,
    SPAN_COLUMNS,
    NotOurDatabase,
    check_schema,
    rollouts_sql,
    row_rollout,
)

__all__ = ["ReadOnlyStore", "StoreNotFound"]


class StoreNotFound(AGLError, FileNotFoundError):
    """The store file to read is not there (or is not a file)."""


class ReadOnlyStore(Store):
    """An existing SQLite store opened read-only: reads work, writes raise, the file is never changed.

    Raises :class:`StoreNotFound` (``agl-lite`` exits with code 2) when ``path`` does not exist and
    :class:`~agentlightning_lite.store.sqlite.NotOurDatabase` when it is not an agentlightning-lite
    store. Unlike ``SQLiteStore(path)``, nothing is created: a file that is cleanly closed (no
    ``-wal`` file next to it) is opened ``immutable`` (no lock or side files); one that a live
    writer holds in WAL mode is opened ``mode=ro`` and sees what the writer has committed.

    >>> import os, tempfile, agentlightning_lite as agl
    >>> path = os.path.join(tempfile.mkdtemp(), "runs.db")
    >>> with agl.SQLiteStore(path) as store:
    ...     with agl.Tracer(store).rollout("2+2?") as ro:
    ...         ro.reward(1.0)
    >>> [r.reward for r in ReadOnlyStore(path).rollouts()]
    [1.0]
    >>> ReadOnlyStore(os.path.join(os.path.dirname(path), "missing.db"))
    Traceback (most recent call last):
    ...
    agentlightning_lite.store.readonly.StoreNotFound: no such file: .../missing.db
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise StoreNotFound(f"no such file: {self.path}")
        if not self.path.is_file():
            raise StoreNotFound(f"not a file: {self.path}")
        wal = self.path.with_name(self.path.name + "-wal")
        # immutable: no locks and no -shm/-wal files created; safe because no writer has it open
        flags = "mode=ro" if wal.exists() else "mode=ro&immutable=1"
        uri = f"file:{quote(str(self.path.resolve()))}?{flags}"
        try:
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            app_id = self._conn.execute("PRAGMA application_id").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            raise NotOurDatabase(f"{self.path} is not a SQLite database ({exc})") from None
        if app_id != APPLICATION_ID:
            self._conn.close()
            raise NotOurDatabase(f"{self.path} is not an agentlightning-lite store")
        try:
            check_schema(self._conn, self.path)
        except NotOurDatabase:
            self._conn.close()
            raise

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run a SQL statement on the file (read-only) and return its rows: the web view's way in;
        the tables are those of :mod:`~agentlightning_lite.store.sqlite_schema`.

        >>> import os, tempfile, agentlightning_lite as agl
        >>> path = os.path.join(tempfile.mkdtemp(), "runs.db")
        >>> with agl.SQLiteStore(path) as store:
        ...     _ = store.start_rollout("2+2?", mode="train")
        >>> ReadOnlyStore(path).query("SELECT mode, status FROM rollouts WHERE mode = ?", ["train"])
        [('train', 'running')]
        """
        return self._conn.execute(sql, tuple(params)).fetchall()

    def rollouts_where(self, where: str, params: Sequence[Any] = ()) -> list[Rollout]:
        """The rollouts matching ``where``, a SQL condition on the ``rollouts`` table with ``?`` marks
        for ``params``, oldest first (as :meth:`SQLiteStore.rollouts_where
        <agentlightning_lite.store.sqlite.SQLiteStore.rollouts_where>`)."""
        return [row_rollout(r) for r in self.query(rollouts_sql(where), params)]

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        rows = self.query(f"SELECT {ROLLOUT_COLUMNS} FROM rollouts WHERE rollout_id = ?", (rollout_id,))
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
            f"SELECT {SPAN_COLUMNS} FROM spans WHERE rollout_id = ? ORDER BY start_time, seq", (rollout_id,)
        )
        return [row_to_span(r) for r in rows]

    def find_rollouts(self, prefix: str, limit: int = 6) -> list[str]:
        """Ids of rollouts whose id starts with ``prefix`` (an exact id first)."""
        prefix = utf8_safe(prefix)  # as the store wrote it
        if self.query("SELECT 1 FROM rollouts WHERE rollout_id = ?", (prefix,)):
            return [prefix]
        escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self.query(
            "SELECT rollout_id FROM rollouts WHERE rollout_id LIKE ? ESCAPE '\\' ORDER BY start_time LIMIT ?",
            (escaped + "%", limit),
        )
        return [r[0] for r in rows]

    def span_summary(self) -> dict[str, dict[str, Any]]:
        """Per rollout: number of spans, of policy LLM calls, and the agents' names (first seen first)."""
        out: dict[str, dict[str, Any]] = {}
        for rid, kind, agent, attrs in self.query(
            "SELECT rollout_id, kind, agent, attributes FROM spans ORDER BY start_time, seq"
        ):
            item = out.setdefault(rid, {"spans": 0, "llm_calls": 0, "agents": []})
            item["spans"] += 1
            if kind == "llm" and "agl.duplicate_of" not in attrs:  # a joined framework view counts once
                item["llm_calls"] += 1
            if agent and agent not in item["agents"]:
                item["agents"].append(agent)
        return out

    def add_spans(self, spans: Iterable[Span]) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def insert_rollout(self, rollout: Rollout) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def update_rollout(self, rollout: Rollout) -> None:
        raise PermissionError(f"{self.path} is opened read-only")

    def close(self) -> None:
        self._conn.close()
