"""Turn arbitrary Python objects into JSON-safe values, with a readable fallback for the rest."""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from collections.abc import Mapping
from typing import Any

_PRIMITIVES = (str, int, bool, type(None))
_MAX_DEPTH = 32


def to_jsonable(value: Any, _depth: int = 0) -> Any:
    """Return a JSON-serialisable version of ``value``; never raises.

    Dicts, lists, tuples, sets, pydantic models and dataclasses are converted recursively.
    Floats that JSON cannot carry (NaN, inf) become strings. Anything else becomes
    ``{"__type__": "module.Class", "__repr__": repr(value)}`` so the payload stays readable.

    >>> to_jsonable({"a": (1, 2), "b": {3}})
    {'a': [1, 2], 'b': [3]}
    >>> to_jsonable(object())["__type__"]
    'builtins.object'
    """
    if isinstance(value, _PRIMITIVES):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if _depth > _MAX_DEPTH:
        return _fallback(value)
    d = _depth + 1
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, d) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, d) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [to_jsonable(v, d) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"__type__": "bytes", "base64": base64.b64encode(value).decode("ascii")}
    model_dump = getattr(value, "model_dump", None)
    if callable(model_dump) and not isinstance(value, type):
        try:
            return to_jsonable(model_dump(), d)
        except Exception:  # a broken model_dump must not crash the agent
            return _fallback(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        try:
            return to_jsonable(dataclasses.asdict(value), d)
        except Exception:
            return _fallback(value)
    tolist = getattr(value, "tolist", None)  # numpy arrays and torch tensors
    if callable(tolist):
        try:
            return to_jsonable(tolist(), d)
        except Exception:
            return _fallback(value)
    return _fallback(value)


def jsonable_copy(value: Any) -> Any:
    """A JSON-safe deep copy of ``value``: the C JSON codec when it can, :func:`to_jsonable` otherwise.

    Plain JSON data (dicts with ``str`` keys, lists, tuples, ``str``, ``int``, finite ``float``,
    ``bool``, ``None``, of exactly those types) is copied directly, with the same result as a
    round trip through JSON.

    >>> src = {"messages": [{"role": "user", "content": "hi"}]}
    >>> dst = jsonable_copy(src)
    >>> dst == src, dst["messages"] is src["messages"]
    (True, False)
    >>> jsonable_copy({"t": (1, 2.5, float("nan"))})
    {'t': [1, 2.5, 'nan']}
    """
    if isinstance(value, _PRIMITIVES):
        return value
    try:
        return _plain_copy(value)
    except (_NotPlain, RecursionError):
        pass
    try:
        return _loads(_dumps(value))
    except (TypeError, ValueError, RecursionError):
        return to_jsonable(value)


class _NotPlain(Exception):
    """Raised by :func:`_plain_copy` for anything but plain JSON data."""


_PLAIN_SCALARS = frozenset({str, int, bool, type(None)})


def _plain_copy(v: Any) -> Any:
    """``json.loads(json.dumps(v))`` for plain JSON data, without the text; raises ``_NotPlain`` else."""
    t = type(v)
    if t in _PLAIN_SCALARS:
        return v
    if t is dict:
        out = {}
        for k, x in v.items():
            if type(k) is not str:  # JSON would turn the key into text: leave it to the codec
                raise _NotPlain
            out[k] = x if type(x) in _PLAIN_SCALARS else _plain_copy(x)
        return out
    if t is list or t is tuple:
        return [x if type(x) in _PLAIN_SCALARS else _plain_copy(x) for x in v]
    if t is float and math.isfinite(v):
        return v
    raise _NotPlain


_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode
_loads = json.loads
_encode_str = json.encoder.encode_basestring  # the C implementation when available


def _fallback(value: Any) -> dict[str, str]:
    cls = type(value)
    try:
        text = repr(value)
    except Exception as exc:  # repr itself may fail on user objects
        text = f"<unrepresentable: {exc!r}>"
    if len(text) > 4000:
        text = text[:4000] + "...<truncated>"
    return {"__type__": f"{cls.__module__}.{cls.__qualname__}", "__repr__": text}


_SURROGATE = re.compile("[\ud800-\udfff]")


def utf8_safe(text: str) -> str:
    """``text`` made encodable as UTF-8: a lone surrogate becomes the escape ``\\uXXXX``.

    Inside JSON the escape decodes back to the same character, so :func:`dumps` output keeps
    its value exactly; in plain text it is a readable mark of where the bad character was.

    >>> utf8_safe("ok") == "ok"
    True
    >>> print(utf8_safe("a" + chr(0xD800) + "b"))
    a\\ud800b
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    return text


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One C encoder made once (``json.dumps`` makes one a call), the same options as ``_dumps``; without
# the check for circular references (a cycle ends in RecursionError, then :func:`to_jsonable`).
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_c_encoder = (
    None
    if _c_make_encoder is None
    else _c_make_encoder(None, _not_json, _encode_str, None, ":", ",", False, False, False)
)
_float_repr = float.__repr__
_int_repr = int.__repr__


def dumps(value: Any) -> str:
    """JSON-encode ``value`` compactly, converting unknown objects with :func:`to_jsonable`.

    The result always encodes as UTF-8 (lone surrogates are written as ``\\u`` escapes).

    >>> dumps({"a": [1, 2.5, None, True]}), dumps(0.1), dumps(float("nan")), dumps({1: "x"})
    ('{"a":[1,2.5,null,true]}', '0.1', '"nan"', '{"1":"x"}')
    """
    if value is None:
        return "null"
    t = type(value)
    if t is str:
        text = _encode_str(value)
        return text if text.isascii() else utf8_safe(text)
    if t is float:
        if math.isfinite(value):
            return _float_repr(value)
    elif t is int:
        return _int_repr(value)
    elif t is bool:
        return "true" if value else "false"
    try:
        text = _dumps(value) if _c_encoder is None else "".join(_c_encoder(value, 0))
        return text if text.isascii() else utf8_safe(text)
    except (TypeError, ValueError, RecursionError):
        return utf8_safe(json.dumps(to_jsonable(value), separators=(",", ":"), ensure_ascii=False))


def loads(text: str | None) -> Any:
    """Inverse of :func:`dumps`; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)


def json_or_text(value: Any, *, containers_only: bool = False) -> Any:
    """``value`` decoded when it is a string holding JSON; anything else (other text too) as it is.

    Frameworks hand over tool arguments and message fields either as JSON text or already decoded.
    ``containers_only`` decodes only text that starts an object or an array, so that text such as
    ``42`` or ``true`` stays text. Never raises (JSON nested too deep to decode stays text).

    >>> json_or_text('{"a": 1}'), json_or_text("2+3"), json_or_text({"a": 1})
    ({'a': 1}, '2+3', {'a': 1})
    >>> json_or_text("42"), json_or_text("42", containers_only=True)
    (42, '42')
    """
    if isinstance(value, str) and (not containers_only or value[:1] in ("{", "[")):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return value
    return value
