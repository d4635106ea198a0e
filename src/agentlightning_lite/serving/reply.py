"""Reading a model's reply: how the served model family writes tool calls (and reasoning).

Every dialect's reply goes through one :class:`ReplyParser` (``server.reply_parser``): it splits the
generated text into the content the agent reads, the reasoning, and OpenAI ``tool_calls``. The
default, :class:`HermesReplyParser`, reads ``<tool_call>{json}</tool_call>`` blocks (what the tool
prompt of :mod:`.chat_format` asks for, and what Hermes-style templates write) and no reasoning.
Parsers for other model families, by vLLM's names, are in :mod:`.parsers`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .chat_format import parse_tool_calls

__all__ = ["HermesReplyParser", "ParsedReply", "ReplyParser", "special_ids_to_drop", "special_token_ids"]


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


class ReplyParser(Protocol):
    """How one model family writes tool calls and reasoning in its replies."""

    #: the name it goes by (vLLM's ``--tool-call-parser`` name where there is one)
    name: str
    #: the reasoning parser's name (vLLM's ``--reasoning-parser``); ``None``: replies carry no reasoning
    reasoning_parser: str | None
    #: whether it reads replies decoded with their special tokens (its markers are special tokens)
    special_tokens: bool

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedReply:
        """Read ``text``; ``tools``: the tools offered to this call (``None``: none were, and the
        reply is all content)."""
        ...


class HermesReplyParser:
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (an answer that is nothing but
    a JSON call object is read as a call too); calls must name an offered tool.

    >>> tools = [{"type": "function", "function": {"name": "calc"}}]
    >>> text = '<tool_call>{"name": "calc", "arguments": {"x": 1}}</tool_call>'
    >>> reply = HermesReplyParser().parse(text, tools)
    >>> reply.content, reply.tool_calls[0]["function"]
    (None, {'name': 'calc', 'arguments': '{"x": 1}'})
    >>> HermesReplyParser().parse("4", None)
    ParsedReply(content='4', reasoning=None, tool_calls=[])
    >>> HermesReplyParser().parse("<tool_call>{not json</tool_call>", tools).tool_parse_failed
    True
    """

    name = "hermes"
    reasoning_parser = None
    special_tokens = False
    marker_tokens = ("<tool_call>", "</tool_call>")

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedReply:
        if not tools:
            return ParsedReply(content=text)
        content, calls = parse_tool_calls(text, tools)
        if not calls and "<tool_call>" in text:
            return ParsedReply(content=text, tool_parse_failed=True)
        return ParsedReply(content=content, tool_calls=calls)


def special_token_ids(tokenizer: Any) -> dict[str, int]:
    """The special tokens of a tokenizer (a Hugging Face one, or anything with ``special_tokens`` texts
    and ``encode``), text -> id: those its decode drops with ``skip_special_tokens=True``.

    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> special_token_ids(ByteTokenizer())
    {'<|im_start|>': 256, '<|im_end|>': 257}
    """
    out: dict[str, int] = {}
    if hasattr(tokenizer, "all_special_ids"):
        out.update(zip(tokenizer.all_special_tokens, tokenizer.all_special_ids, strict=False))
        for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(added, "special", False):
                out[str(getattr(added, "content", added))] = int(i)
    elif isinstance(getattr(tokenizer, "special_tokens", None), (tuple, list)):
        for t in tokenizer.special_tokens:
            ids = tokenizer.encode(t)
            if len(ids) == 1:
                out[t] = int(ids[0])
    return out


def special_ids_to_drop(tokenizer: Any, parser: ReplyParser) -> frozenset[int] | None:
    """For a parser that reads replies decoded without special tokens: when some of its markers
    (``parser.marker_tokens``, such as ``<tool_call>`` or ``<think>``) are special tokens of
    ``tokenizer``, the special token ids to drop from a reply before decoding it with the rest kept (the
    end-of-turn, EOS and pad tokens and any other special token go, the markers stay for the parser);
    ``None`` when the plain decode keeps every marker (or the parser reads all special tokens itself).

    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> class Markers(ByteTokenizer):
    ...     special_tokens = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
    >>> sorted(special_ids_to_drop(Markers(), HermesReplyParser()))  # <|im_start|>, <|im_end|>
    [256, 257]
    >>> special_ids_to_drop(ByteTokenizer(), HermesReplyParser()) is None  # its markers are text
    True
    """
    if tokenizer is None or parser.special_tokens:
        return None
    specials = special_token_ids(tokenizer)
    markers = {specials[t] for t in getattr(parser, "marker_tokens", ()) if t in specials}
    if not markers:
        return None
    return frozenset(set(specials.values()) - markers)
