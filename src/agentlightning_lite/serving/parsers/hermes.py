"""The Hermes tool-call format (vLLM's ``hermes``):
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, what the server's own tool prompt
asks for (:data:`~..chat_format.TOOLS_PROMPT`) and what Hermes-style templates (Qwen2.5, Qwen3's JSON
form) write."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .base import Call, ToolParser, held, tool_names

__all__ = ["HermesToolParser", "read_hermes"]

_OPEN, _CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.S)
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


def _as_call(obj: Any, names: set[str] | None) -> Call | None:
    if not isinstance(obj, dict):
        return None
    name = obj.get("name")
    if not isinstance(name, str) or (names is not None and name not in names):
        return None
    if "arguments" in obj:
        args = obj["arguments"]
    elif "parameters" in obj:
        args = obj["parameters"]
    else:
        return None
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None
    return (name, args) if isinstance(args, dict) else None


def _loads(text: str) -> Any:
    text = text.strip()
    fence = _FENCE.match(text)
    if fence:
        text = fence.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _blocks(text: str, names: set[str] | None) -> tuple[list[Call], list[str], int]:
    """The calls of the ``<tool_call>`` blocks of ``text``, the text kept around and between them, and
    where the text after the last call begins."""
    calls: list[Call] = []
    kept: list[str] = []
    last = 0
    for match in _BLOCK.finditer(text):
        call = _as_call(_loads(match.group(1)), names)
        if call is None:
            continue
        calls.append(call)
        kept.append(text[last : match.start()])
        last = match.end()
    return calls, kept, last


def read_hermes(text: str, tools: Sequence[dict[str, Any]] | None = None) -> tuple[str | None, list[Call]]:
    """Split a reply into (content, calls): ``<tool_call>{...}</tool_call>`` blocks (an unclosed last
    block too) and, failing those, an answer that is nothing but a JSON call object (or list of them,
    maybe in a fenced block). Calls must name one of ``tools`` (when given) and carry object arguments;
    a block that is not one stays content, and with calls the content is stripped.

    >>> read_hermes('Let me compute.<tool_call>{"name": "calc", "arguments": {"x": 2}}</tool_call>', None)
    ('Let me compute.', [('calc', {'x': 2})])
    >>> read_hermes('{"name": "calc", "parameters": {}}', None), read_hermes("4", None)
    ((None, [('calc', {})]), ('4', []))
    """
    names = tool_names(tools)
    calls, kept, last = _blocks(text, names)
    if calls:
        kept.append(text[last:])
        content = "".join(kept).strip()
        return (content or None), calls
    obj = _loads(text)
    objs = obj if isinstance(obj, list) else [obj]
    found = [_as_call(o, names) for o in objs] if obj is not None else []
    if found and all(c is not None for c in found):
        return None, [c for c in found if c is not None]
    return text, []


class HermesToolParser(ToolParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Hermes, Qwen2.5, Qwen3's JSON form).

    Each well-formed block naming an offered tool is a call; the text around them, and any block that
    is not one, stays content (vLLM keeps only the text before the first block, and turns every call
    back into content when one block is malformed). An answer that is nothing but a JSON call object
    is a call too.

    Streamed, a closed block is a call as soon as it closes; content is sent as it comes, but for the
    text of a block still open, whitespace that may yet be stripped, and a reply that begins as JSON (a
    call object maybe) or with whitespace until a call is read (without one, the reply stays as written).

    >>> HermesToolParser().read('Checking.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>', None)
    ('Checking.', [('f', {'x': 1})])
    >>> HermesToolParser().certain('Checking. <tool_call>{"name": "f", "arguments": {}}</tool_call><to', None)
    ('Checking.', [('f', {})])
    """

    name = "hermes"
    markers = (_OPEN,)
    tokens = (_OPEN, _CLOSE)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        return read_hermes(text, tools)

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        open_at = len(text)
        for match in _BLOCK.finditer(text):
            if not match.group(0).endswith(_CLOSE):
                open_at = match.start()  # a block still being written: a call or content, not known yet
        closed = held(text[:open_at], [_OPEN])
        calls, kept, last = _blocks(closed, tool_names(tools))
        if calls:  # the reply has calls: its content is the text around them, stripped
            return "".join([*kept, closed[last:]]).strip(), calls
        if not closed[:1] or closed[:1].isspace() or closed.lstrip()[:1] in ("{", "[", "`"):
            return "", []  # kept as written (no call) or stripped (a call later), or a JSON call maybe
        return closed.rstrip(), []
