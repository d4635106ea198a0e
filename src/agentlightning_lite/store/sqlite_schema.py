"""The SQLite store's file format: its schema and marks, and the rows of rollouts and spans.

What a reader of the file needs (:class:`~.readonly.ReadOnlyStore`, the web view) without the writer:
:class:`~.sqlite.SQLiteStore` writes these rows; :func:`check_schema` refuses a file that is not
this package's or is newer than it reads.
"""

from __future__ import annotations

import sqlite3
import struct
from typing import Any

from .._json import dumps, loads, utf8_safe
from ..errors import InvalidRequestError
from ..types import TRUSTED, Rollout
from .rows import SpanRow, floats_to_blob, ids_to_blob

__all__ = [
    "APPLICATION_ID",
    "ROLLOUT_COLUMNS",
    "ROLLOUT_INSERT",
    "ROLLOUT_UPDATE",
    "SCHEMA",
    "SCHEMA_VERSION",
    "SPAN_COLUMNS",
    "SPAN_UPSERT",
    "NotOurDatabase",
    "check_schema",
    "db_row",
    "db_row_raw",
    "floats_blob",
    "ids_blob",
    "rollout_row",
    "rollouts_sql",
    "row_rollout",
]

#: ``PRAGMA application_id`` of files written by this package ("AGLL").
APPLICATION_ID = 0x41474C4C
SCHEMA_VERSION = 1

SCHEMA = """
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
    seq                INTEGER PRIMARY KEY,  -- insertion order
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
    prompt_token_ids   BLOB,    -- little-endian int32, 4 bytes a token
    response_token_ids BLOB,    -- little-endian int32
    response_logprobs  BLOB     -- little-endian float64, one per response token
);
CREATE INDEX IF NOT EXISTS spans_rollout ON spans(rollout_id, start_time);
"""

SPAN_COLUMNS = (
    "span_id, rollout_id, parent_id, kind, name, agent, start_time, end_time, status, error, "
    "input, output, attributes, model, prompt_token_ids, response_token_ids, response_logprobs"
)
# A span id stored under another rollout is not replaced (the WHERE of DO UPDATE): such a row
# changes nothing, which the flush notices (see Store for the rules).
SPAN_UPSERT = (
    f"INSERT INTO spans ({SPAN_COLUMNS}) VALUES ({', '.join('?' * 17)}) "
    "ON CONFLICT(span_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in SPAN_COLUMNS.split(", ")[1:])
    + " WHERE spans.rollout_id = excluded.rollout_id"
)
ROLLOUT_COLUMNS = "rollout_id, task, mode, status, start_time, end_time, reward, metadata, error"
ROLLOUT_INSERT = (
    f"INSERT INTO rollouts ({ROLLOUT_COLUMNS}) VALUES ({', '.join('?' * 9)}) "
    "ON CONFLICT(rollout_id) DO NOTHING"
)
# task, mode and start_time are fixed when a rollout starts; the rest may change (metadata too: a
# timed-out rollout's late result is kept in it)
ROLLOUT_UPDATE = (
    "UPDATE rollouts SET status = ?, end_time = ?, reward = ?, error = ?, metadata = ? WHERE rollout_id = ?"
)


class NotOurDatabase(InvalidRequestError):
    """The file is a SQLite database written by something else, or not a database at all."""


def check_schema(conn: sqlite3.Connection, path: Any) -> None:
    """Raise :class:`NotOurDatabase` when a store was written by a newer schema than this one reads."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise NotOurDatabase(
            f"{path} was written by a newer agentlightning-lite (store schema {version}; this version "
            f"reads schema {SCHEMA_VERSION} and older): upgrade agentlightning-lite to open it"
        )


def _text_columns(r: SpanRow) -> tuple[Any, ...]:
    """The row's first 14 columns, with text that SQLite's UTF-8 cannot hold escaped."""
    return tuple(utf8_safe(v) if type(v) is str else v for v in r[:14])


_int32s: dict[int, Any] = {}  # token count -> the bound pack of a little-endian struct of that many
_float64s: dict[int, Any] = {}


def _pack(cache: dict[int, Any], code: str, n: int) -> Any:
    pack = cache[n] = struct.Struct(f"<{n}{code}").pack
    if len(cache) > 4096:  # lengths vary with every prompt: keep the cache bounded
        cache.clear()
        cache[n] = pack
    return pack


def ids_blob(ids: Any) -> bytes | None:
    """Token ids (a list or tuple of ints, or ``None``) as little-endian int32 bytes, 4 bytes a token.

    ``struct`` packs a sequence of ints several times faster than ``array`` fills one; the bytes are
    the same. What ``struct`` refuses goes through ``array``, which raises its own error for it.

    >>> ids_blob([1, 2**31 - 1]) == (1).to_bytes(4, "little") + (2**31 - 1).to_bytes(4, "little")
    True
    >>> ids_blob(None) is None, ids_blob(b"\\x01\\x00\\x00\\x00")
    (True, b'\\x01\\x00\\x00\\x00')
    """
    if ids is None or isinstance(ids, bytes):
        return ids
    n = len(ids)
    try:
        return (_int32s.get(n) or _pack(_int32s, "i", n))(*ids)
    except struct.error:
        return ids_to_blob(list(ids))


def floats_blob(values: Any) -> bytes | None:
    """Logprobs (a list or tuple of floats, or ``None``) as little-endian float64 bytes (exact).

    >>> floats_blob([-0.5]) == bytes.fromhex("000000000000e0bf")
    True
    """
    if values is None or isinstance(values, bytes):
        return values
    n = len(values)
    try:
        return (_float64s.get(n) or _pack(_float64s, "d", n))(*values)
    except struct.error:
        return floats_to_blob(list(values))


def db_row(r: SpanRow) -> tuple[Any, ...]:
    """The SQL parameters of a span row (``SPAN_UPSERT``'s): token fields as little-endian bytes."""
    return (*_text_columns(r), ids_blob(r[14]), ids_blob(r[15]), floats_blob(r[16]))


def db_row_raw(r: SpanRow) -> tuple[Any, ...]:
    """:func:`db_row` with the text as it is: binding it raises ``UnicodeEncodeError`` for text
    that UTF-8 cannot hold (a lone surrogate), and then :func:`db_row` is the one to use.

    >>> from .rows import SpanRow
    >>> row = SpanRow("s1", "r1", None, "llm", "chat", None, 1.0, 2.0, "ok", None, "null", '"hi"', "{}",
    ...               "policy", [1, 2], [3], [-0.5])
    >>> params = db_row_raw(row)
    >>> params[:3], params[14] == db_row(row)[14], params[16] == db_row(row)[16]
    (('s1', 'r1', None), True, True)
    """
    return (*r[:14], ids_blob(r[14]), ids_blob(r[15]), floats_blob(r[16]))


def rollout_row(r: Rollout) -> tuple[Any, ...]:
    """The SQL parameters of a rollout (``ROLLOUT_INSERT``'s, in ``ROLLOUT_COLUMNS`` order)."""
    return (
        utf8_safe(r.rollout_id),
        dumps(r.task),
        r.mode,
        r.status,
        r.start_time,
        r.end_time,
        r.reward,
        dumps(r.metadata),
        None if r.error is None else utf8_safe(r.error),
    )


def rollouts_sql(where: str = "") -> str:
    """The query of whole rollouts (``ROLLOUT_COLUMNS``) matching ``where``, a SQL condition on the
    ``rollouts`` table (none: all of them), oldest first.

    >>> rollouts_sql("mode = ?").endswith("FROM rollouts WHERE mode = ? ORDER BY start_time, rowid")
    True
    """
    condition = f" WHERE {where}" if where else ""
    return f"SELECT {ROLLOUT_COLUMNS} FROM rollouts{condition} ORDER BY start_time, rowid"


def row_rollout(r: tuple[Any, ...]) -> Rollout:
    """A rollout read back from its row (``ROLLOUT_COLUMNS`` order)."""
    return Rollout.model_validate(
        {
            "rollout_id": r[0],
            "task": loads(r[1]),
            "mode": r[2],
            "status": r[3],
            "start_time": r[4],
            "end_time": r[5],
            "reward": r[6],
            "metadata": loads(r[7]),
            "error": r[8],
        },
        context=TRUSTED,
    )
