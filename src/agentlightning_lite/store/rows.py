"""The compact row form of a span that the tracer hands to stores (payloads already JSON-encoded).

Encoding a span's payloads once, when it ends, is both the defensive copy (later mutation of the
agent's objects cannot change what was recorded) and the serialisation the SQLite store needs, so
the hot path never builds a pydantic model. Stores turn rows back into :class:`Span` on read.
"""

from __future__ import annotations

import json
from array import array
from sys import byteorder
from typing import Any, NamedTuple

from .._json import dumps
from ..types import TRUSTED, Span


class SpanRow(NamedTuple):
    """A span in row form: the SQLite column order, payloads already JSON text.

    What the tracer writes through :meth:`Store.add_span_rows
    <agentlightning_lite.store.base.Store.add_span_rows>`: ``input``, ``output`` and ``attributes``
    are JSON text; the three token fields are Python lists (or ``None``; a store may hold them as
    little-endian bytes). Stores turn rows back into :class:`~agentlightning_lite.types.Span` on read.

    >>> from agentlightning_lite.store.rows import SpanRow, row_to_span
    >>> row = SpanRow("s1", "r1", None, "reward", "reward", None, 1.0, 1.0, "ok", None,
    ...               "null", "1.0", '{"reward": 1.0}', None, None, None, None)
    >>> (row.kind, row_to_span(row).output, row._replace(output="0.5").output)
    ('reward', 1.0, '0.5')
    """

    span_id: str
    rollout_id: str
    parent_id: str | None
    kind: str
    name: str
    agent: str | None
    start_time: float
    end_time: float | None
    status: str
    error: str | None
    input: str  # JSON text
    output: str  # JSON text
    attributes: str  # JSON object text
    model: str | None
    prompt_token_ids: list[int] | bytes | None
    response_token_ids: list[int] | bytes | None
    response_logprobs: list[float] | bytes | None


#: The row's field names, in the SQLite column order.
SPAN_FIELDS: tuple[str, ...] = SpanRow._fields
_EMPTY = "{}"
_SWAP = byteorder != "little"


def span_to_row(s: Span) -> SpanRow:
    """Encode a :class:`Span` as a row."""
    return SpanRow(
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
        dumps(s.attributes) if s.attributes else _EMPTY,
        s.model,
        s.prompt_token_ids,
        s.response_token_ids,
        s.response_logprobs,
    )


def row_to_span(r: SpanRow | tuple[Any, ...]) -> Span:
    """Decode a row (as stored by either store) into a :class:`Span`."""
    return Span.model_validate(
        {
            "span_id": r[0],
            "rollout_id": r[1],
            "parent_id": r[2],
            "kind": r[3],
            "name": r[4],
            "agent": r[5],
            "start_time": r[6],
            "end_time": r[7],
            "status": r[8],
            "error": r[9],
            "input": json.loads(r[10]),
            "output": json.loads(r[11]),
            "attributes": {} if r[12] == _EMPTY else json.loads(r[12]),
            "model": r[13],
            "prompt_token_ids": ids_from_blob(r[14]),
            "response_token_ids": ids_from_blob(r[15]),
            "response_logprobs": floats_from_blob(r[16]),
        },
        context=TRUSTED,
    )


def ids_to_blob(ids: list[int] | bytes | None) -> bytes | None:
    """Token ids as little-endian int32 bytes (4 bytes a token)."""
    if ids is None or isinstance(ids, bytes):
        return ids
    a = array("i", ids)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def floats_to_blob(values: list[float] | bytes | None) -> bytes | None:
    """Logprobs as little-endian float64 bytes (exact)."""
    if values is None or isinstance(values, bytes):
        return values
    a = array("d", values)
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def ids_from_blob(blob: bytes | list[int] | None) -> list[int] | None:
    if blob is None or isinstance(blob, list):
        return blob
    a = array("i")
    a.frombytes(blob)
    if _SWAP:
        a.byteswap()
    return a.tolist()


def floats_from_blob(blob: bytes | list[float] | None) -> list[float] | None:
    if blob is None or isinstance(blob, list):
        return blob
    a = array("d")
    a.frombytes(blob)
    if _SWAP:
        a.byteswap()
    return a.tolist()
