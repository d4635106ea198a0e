# ruff: noqa: RUF001  (DeepSeek's markers are written with full-width bars)
"""What every tool-call parser shares: the call it finds, the offered tools' schemas, typing by schema.

A tool parser reads one model family's way of writing tool calls; :meth:`ToolParser.read` returns the
content left and the calls, each ``(name, arguments dict)``. Typing follows vLLM's
``coerce_to_schema_type``: a text value is turned into the JSON type its property's schema names
(``null`` > ``integer`` > ``number`` > ``boolean`` > ``object`` > ``array`` > ``string``, the first
that parses), a property without a schema keeps its text.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import string
from collections.abc import Sequence
from typing import Any, ClassVar

__all__ = [
    "Call",
    "ToolParser",
    "alphanumeric_id",
    "coerce",
    "fix_types",
    "held",
    "held_end_markers",
    "strip_end_markers",
    "tool_names",
    "tool_properties",
]

#: a tool call read from a reply: the tool's name and its arguments
Call = tuple[str, dict[str, Any]]

# tokens that end a turn, left at the end of a reply decoded with its special tokens
_END_TOKENS = (
    "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "</s>", "<|return|>",
    "<|call|>", "<|end|>", "<｜end▁of▁sentence｜>", "<|user|>", "<|observation|>",
)  # fmt: skip
_END_MARKERS = re.compile("(?:" + "|".join(map(re.escape, _END_TOKENS)) + r")+\s*\Z")

_ALIASES = {"str": "string", "text": "string", "int": "integer", "float": "number", "bool": "boolean"}
_PRIORITY = ("null", "integer", "number", "boolean", "object", "array", "string")


def alphanumeric_id(length: int = 9) -> str:
    """A random id of ``length`` letters and digits (Mistral's tool call ids: its chat templates
    reject any other id in the history).

    >>> len(alphanumeric_id()), alphanumeric_id().isalnum()
    (9, True)
    """
    return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(length))


def strip_end_markers(text: str) -> str:
    """``text`` without the end-of-turn tokens a decode that keeps special tokens leaves at its end.

    >>> strip_end_markers('[TOOL_CALLS]f[ARGS]{}</s>')
    '[TOOL_CALLS]f[ARGS]{}'
    """
    return _END_MARKERS.sub("", text)


def held(text: str, markers: Sequence[str]) -> str:
    """``text`` without its end where that end could be the start of one of ``markers`` (what a
    streamed reply holds back until the next piece says whether a marker is being written).

    >>> held("Sure.<tool_", ["<tool_call>"]), held("a < b", ["<tool_call>"])
    ('Sure.', 'a < b')
    """
    for k in range(min(len(text), max(map(len, markers), default=1) - 1), 0, -1):
        tail = text[-k:]
        if any(m.startswith(tail) and m != tail for m in markers):
            return text[:-k]
    return text


def _tail_start(s: str) -> bool:
    """Whether ``s`` could begin the end-of-turn tokens (and whitespace) a decode leaves at the end."""
    i, seen = 0, False
    while i < len(s):
        marker = next((m for m in _END_TOKENS if s.startswith(m, i)), None)
        if marker is None:
            rest = s[i:]
            return any(m.startswith(rest) for m in _END_TOKENS) or (seen and rest.isspace())
        i, seen = i + len(marker), True
    return True


def held_end_markers(text: str) -> str:
    """The start of a streamed reply that :func:`strip_end_markers` keeps however the reply goes on:
    ``text`` without the end-of-turn tokens (whole or begun) it ends with.

    >>> held_end_markers("4<|ret"), held_end_markers("4<|return|>"), held_end_markers("a<|end|>b")
    ('4', '4', 'a<|end|>b')
    """
    start = len(text)
    i = text.rfind("<")
    while i >= 0 and _tail_start(text[i:]):
        start, i = i, text.rfind("<", 0, i)
    return text[:start]


def _function(tool: Any) -> dict[str, Any]:
    fn = tool.get("function", tool) if isinstance(tool, dict) else None
    return fn if isinstance(fn, dict) else {}


def tool_names(tools: Sequence[dict[str, Any]] | None) -> set[str] | None:
    """The names of the offered tools (``None``: no tools given, any name is taken)."""
    if tools is None:
        return None
    return {n for n in (_function(t).get("name") for t in tools) if isinstance(n, str)}


def tool_properties(tools: Sequence[dict[str, Any]] | None, name: str) -> dict[str, Any]:
    """The ``properties`` of tool ``name``'s parameter schema (empty when unknown)."""
    for t in tools or ():
        fn = _function(t)
        if fn.get("name") == name:
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            return props if isinstance(props, dict) else {}
    return {}


def _types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    out: set[str] = set()
    t = schema.get("type")
    for v in [t] if isinstance(t, str) else t if isinstance(t, list) else []:
        if isinstance(v, str):
            out.add(_ALIASES.get(v.strip().lower(), v.strip().lower()))
    for v in schema.get("enum") or [] if isinstance(schema.get("enum"), list) else []:
        out.add(
            "null"
            if v is None
            else "boolean"
            if isinstance(v, bool)
            else "integer"
            if isinstance(v, int)
            else "number"
            if isinstance(v, float)
            else "array"
            if isinstance(v, list)
            else "object"
            if isinstance(v, dict)
            else "string"
        )
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for choice in schema[key]:
                out |= _types(choice)
    return out or {"string"}


def _finite(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list):
        return all(_finite(x) for x in v)
    if isinstance(v, dict):
        return all(_finite(x) for x in v.values())
    return True


def coerce(value: str, schema: Any) -> Any:
    """``value`` (text a model wrote) as the JSON type ``schema`` names, else as it is.

    >>> coerce("5", {"type": "integer"}), coerce("2.5", {"type": "number"}), coerce("1", {"type": "boolean"})
    (5, 2.5, True)
    >>> coerce('{"a": 1}', {"type": "object"}), coerce("5", {"type": "string"}), coerce("x", {"type": "null"})
    ({'a': 1}, '5', 'x')
    """
    types = _types(schema)
    for t in _PRIORITY:
        if t not in types:
            continue
        if t == "null":
            if value.lower() == "null":
                return None
        elif t == "string":
            return value
        elif t == "integer":
            try:
                return int(value)
            except ValueError:
                pass
        elif t == "number":
            try:
                f = float(value)
            except ValueError:
                continue
            if math.isfinite(f):
                return int(f) if f == int(f) else f
        elif t == "boolean":
            low = value.lower().strip()
            if low in ("true", "1", "false", "0"):
                return low in ("true", "1")
        else:
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value


def _fix(value: Any, schema: dict[str, Any]) -> Any:
    if isinstance(value, str):
        return coerce(value, schema)
    if isinstance(value, dict):
        props = schema.get("properties")
        return fix_types(value, props) if isinstance(props, dict) else value
    if isinstance(value, list):
        items = schema.get("items")
        return [_fix(v, items) for v in value] if isinstance(items, dict) else value
    return coerce(json.dumps(value, ensure_ascii=False), schema)


def fix_types(args: dict[str, Any], properties: dict[str, Any]) -> dict[str, Any]:
    """``args`` with each value typed by its property's schema (vLLM's ``_fix_arg_types``): text is
    coerced, objects and arrays are typed inside, other values are re-read as their schema says.

    >>> fix_types({"n": "3", "tag": 7, "free": "1"}, {"n": {"type": "integer"}, "tag": {"type": "string"}})
    {'n': 3, 'tag': '7', 'free': '1'}
    """
    return {k: _fix(v, properties[k]) if isinstance(properties.get(k), dict) else v for k, v in args.items()}


class ToolParser:
    """One model family's tool-call format. Subclasses set ``name`` (vLLM's ``--tool-call-parser``
    name) and implement :meth:`read`; ``special_tokens``: its markers are special tokens, so it reads
    the reply decoded with them; ``markers``: the texts that begin a call in its format (a reply that
    holds one but yields no call is a call the parser could not read: :meth:`has_marker`)."""

    name: ClassVar[str] = ""
    special_tokens: ClassVar[bool] = False
    markers: ClassVar[tuple[str, ...]] = ()
    #: the format's marker texts that a tokenizer may hold as one (maybe special) token each: where the
    #: served tokenizer marks them special, replies are decoded keeping them (and no other special token)
    tokens: ClassVar[tuple[str, ...]] = ()

    def has_marker(self, text: str) -> bool:
        """Whether ``text`` holds one of the format's call markers (:attr:`markers`).

        >>> from agentlightning_lite.serving.parsers import TOOL_PARSERS
        >>> TOOL_PARSERS["hermes"]().has_marker("<tool_call>{not json</tool_call>")
        True
        """
        return any(m in text for m in self.markers)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        """Split ``text`` into (content, calls); ``tools``: the offered tools (``None``: take any name)."""
        raise NotImplementedError

    def content_only(self, text: str) -> str | None:
        """The content of a reply read without tools (its text, unless the format wraps it)."""
        return text

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        """What ``text``, the start of a streamed reply, already fixes however the reply goes on: the
        start of the content :meth:`read` will give, and its first calls. The default fixes nothing
        (the whole reply is read when it ends); a format overrides it with its own rules.

        >>> ToolParser().certain("Hello", None)
        ('', [])
        """
        return "", []

    def certain_content_only(self, text: str) -> str:
        """The start of :meth:`content_only`'s content that ``text``, the start of a reply, fixes."""
        return text

    def call_id(self) -> str:
        """A fresh id for a call read from a reply (OpenAI's ``call_`` + 24 hex characters; a format
        whose template checks the ids it is given back makes its own).

        >>> ToolParser().call_id().startswith("call_")
        True
        """
        return "call_" + secrets.token_hex(12)

    @staticmethod
    def allowed(name: Any, tools: Sequence[dict[str, Any]] | None) -> bool:
        """Whether ``name`` is a tool name this reply may call (an offered one, when tools are given)."""
        names = tool_names(tools)
        return isinstance(name, str) and bool(name) and (names is None or name in names)

    @staticmethod
    def named(name: Any) -> bool:
        """Whether ``name`` can name a tool (vLLM's parsers, but ``hermes`` and ``glm45``, take calls to
        tools that were not offered: the agent answers them)."""
        return isinstance(name, str) and bool(name)

    @staticmethod
    def json_args(raw: Any) -> dict[str, Any] | None:
        """Arguments given as a JSON object or its text (``None`` when they are neither)."""
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except ValueError:
                return None
        return raw if isinstance(raw, dict) else None
