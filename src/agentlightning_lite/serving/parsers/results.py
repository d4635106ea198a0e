"""What the reply parsers give back: a whole reply read (:class:`ParsedReply`) and what a streamed reply
adds with each piece of text (:class:`ReplyDelta`, its calls as :class:`ToolCallDelta`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ParsedReply", "ReplyDelta", "ToolCallDelta"]


@dataclass
class ParsedReply:
    """One generated reply, read: ``content`` (``None`` when the reply is only tool calls), the
    ``reasoning`` it wrote apart from its answer (``None`` when none), and its ``tool_calls`` (OpenAI's
    shape: ``{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}``).

    ``tool_parse_failed``: tools were offered and the reply holds a call marker of the format (such
    as ``<tool_call>``) but no call could be read from it (the server records it, with the reply's
    whole text, on the call's span and warns once; what stays content is the format's rule)."""

    content: str | None
    reasoning: str | None = None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    tool_parse_failed: bool = field(default=False, repr=False)

    @property
    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        """The tool calls as ``(name, arguments dict)`` pairs.

        >>> ParsedReply(None, tool_calls=[{"id": "c1", "type": "function",
        ...             "function": {"name": "f", "arguments": '{"x": 1}'}}]).calls
        [('f', {'x': 1})]
        """
        return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in self.tool_calls]


@dataclass
class ToolCallDelta:
    """A piece of the ``index``-th tool call of a streamed reply (vLLM's ``DeltaToolCall``): its first
    piece has the call's ``id`` and ``name``; ``arguments`` is the next fragment of its arguments' JSON
    text (the fragments of one call, joined, are the ``arguments`` of the whole reply's call).

    >>> ToolCallDelta(0, "call_1", "f", '{"x": 1}').openai()
    {'index': 0, 'id': 'call_1', 'type': 'function', 'function': {'name': 'f', 'arguments': '{"x": 1}'}}
    >>> ToolCallDelta(0, arguments="}").openai()
    {'index': 0, 'function': {'arguments': '}'}}
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""

    def openai(self) -> dict[str, Any]:
        """The delta as a Chat Completions chunk carries it (``choices[].delta.tool_calls[]``)."""
        out: dict[str, Any] = {"index": self.index}
        if self.id is not None:
            out |= {"id": self.id, "type": "function"}
        fn: dict[str, Any] = {} if self.name is None else {"name": self.name}
        out["function"] = fn | {"arguments": self.arguments}
        return out


@dataclass
class ReplyDelta:
    """What one piece of a streamed reply made certain: more ``reasoning`` text, more ``content`` text
    and pieces of ``tool_calls``. Everything a stream gives, joined, is what the whole reply reads as.

    >>> d = ReplyDelta(content="Hi")
    >>> bool(d), bool(ReplyDelta())
    (True, False)
    """

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)
