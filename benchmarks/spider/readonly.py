"""Run agent-written SQL on a Spider database: read-only, time-limited and row-capped.

Three independent guards keep a query from changing anything: the file is opened with SQLite's
``mode=ro`` URI, ``PRAGMA query_only`` is on, and an authorizer allows only reading (``SELECT``,
column reads, functions, recursive CTEs) and refuses everything else (writes, ``ATTACH``, ``PRAGMA``
other than the schema-reading ``table_info`` / ``foreign_key_list`` kind, transactions). A progress
handler aborts a query that runs past its time limit, and at most ``max_rows`` rows are fetched.

>>> run_query(db, "SELECT count(*) FROM singer")  # doctest: +SKIP
[(6,)]
>>> run_query(db, "DROP TABLE singer")  # doctest: +SKIP
Traceback (most recent call last):
SQLError: not authorized
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from pathlib import Path

#: the authorizer actions a read-only query needs; anything else is denied
_ALLOWED = frozenset(
    {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
)
#: pragmas that only describe the schema (``PRAGMA table_info(singer)``)
_SCHEMA_PRAGMAS = frozenset({"table_info", "table_xinfo", "foreign_key_list", "index_list", "index_info"})
#: SQLite virtual-machine instructions between two checks of the clock
_PROGRESS_EVERY = 1000

DEFAULT_TIMEOUT_S = 2.0
DEFAULT_MAX_ROWS = 10_000


class SQLError(Exception):
    """A query failed: a SQL error, a refused write, the time limit or the row cap."""


def _authorize(action: int, arg1: str | None, *_rest: object) -> int:
    if action in _ALLOWED or (action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _SCHEMA_PRAGMAS):
        return sqlite3.SQLITE_OK
    return sqlite3.SQLITE_DENY


def connect_readonly(db_path: Path | str) -> sqlite3.Connection:
    """Open ``db_path`` read-only (``mode=ro`` URI, ``query_only``, a read-only authorizer)."""
    path = Path(db_path).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"no SQLite database at {path}")
    uri = f"file:{urllib.parse.quote(str(path))}?mode=ro"
    con = sqlite3.connect(uri, uri=True, check_same_thread=False)
    con.execute("PRAGMA query_only = ON")
    con.set_authorizer(_authorize)
    return con


def run_query(
    db_path: Path | str,
    sql: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_rows: int = DEFAULT_MAX_ROWS,
) -> list[tuple[object, ...]]:
    """Execute one statement read-only and return its rows; raises :class:`SQLError` on any failure.

    A query still running after ``timeout_s`` seconds is interrupted; one returning more than
    ``max_rows`` rows is an error (no Spider gold query returns more than 1,860).
    """
    con = connect_readonly(db_path)
    deadline = time.monotonic() + timeout_s
    con.set_progress_handler(lambda: int(time.monotonic() > deadline), _PROGRESS_EVERY)
    try:
        rows = con.execute(sql).fetchmany(max_rows + 1)
    except sqlite3.OperationalError as exc:
        if time.monotonic() > deadline and "interrupted" in str(exc):
            raise SQLError(f"query exceeded the {timeout_s:g} s time limit") from None
        raise SQLError(str(exc)) from None
    except (sqlite3.Error, sqlite3.Warning, ValueError) as exc:  # ValueError: e.g. an embedded NUL
        raise SQLError(str(exc)) from None
    finally:
        con.close()
    if len(rows) > max_rows:
        raise SQLError(f"query returned more than {max_rows} rows")
    return rows
