"""Reading a model's reply: how the served model family writes tool calls (and reasoning).

Every dialect's reply goes through one :class:`ReplyParser` (``server.reply_parser``): it splits the
generated text into the content the agent reads, the reasoning, and OpenAI ``tool_calls``. The
default, :class:`HermesReplyParser`, reads ``<tool_call>{json}</tool_call>`` blocks (what the tool
prompt of :mod:`.chat_format` asks for, and what Hermes-style templates write) and no reasoning.
Every format is read in :mod:`.parsers` (by vLLM's names); this module decodes replies for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from .parsers.combined import ModelReplyParser
from .parsers.hermes import HermesToolParser
from .parsers.results import ParsedReply

if TYPE_CHECKING:
    from .engines.contract import ServingEngine

__all__ = ["HermesReplyParser", "ParsedReply", "ReplyParser", "decode_keeping", "special_markers"]


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


class HermesReplyParser(ModelReplyParser):
    """``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (an answer that is nothing but
    a JSON call object is read as a call too); calls must name an offered tool: the ``hermes`` parser
    of :mod:`.parsers` and no reasoning.

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

    def __init__(self) -> None:
        super().__init__(HermesToolParser())

    def __repr__(self) -> str:
        return "HermesReplyParser()"


def special_markers(engine: ServingEngine, parser: ReplyParser) -> dict[int, str]:
    """The reply parser's markers (``parser.marker_tokens``, such as ``<tool_call>`` or ``<think>``) that
    are special tokens of the engine's tokenizer, id -> text: a plain decode drops them, so replies are
    read with :func:`decode_keeping` them. Empty when every marker is text (or an added token that is
    not special), and for a parser that reads all special tokens itself (``parser.special_tokens``).

    >>> from agentlightning_lite.serving.engines import ScriptedEngine
    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> class Marked(ByteTokenizer):
    ...     special_tokens = ("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")
    >>> special_markers(ScriptedEngine(["x"], tokenizer=Marked()), HermesReplyParser())
    {258: '<tool_call>', 259: '</tool_call>'}
    >>> special_markers(ScriptedEngine(["x"], tokenizer=ByteTokenizer()), HermesReplyParser())
    {}
    """
    if parser.special_tokens:
        return {}
    out: dict[int, str] = {}
    for text in getattr(parser, "marker_tokens", ()):
        ids = engine.encode(text)
        if len(ids) == 1 and engine.decode(ids, skip_special_tokens=True) == "":
            out[ids[0]] = text
    return out


def decode_keeping(engine: ServingEngine, token_ids: Sequence[int], markers: dict[int, str]) -> str:
    """``token_ids`` decoded without special tokens, except ``markers`` (id -> text), which stay: the
    end-of-turn, EOS and pad tokens and any other special token are dropped.

    >>> from agentlightning_lite.serving.engines import ScriptedEngine
    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> engine = ScriptedEngine(["x"], tokenizer=ByteTokenizer())
    >>> decode_keeping(engine, engine.encode("<|im_start|>hi<|im_end|>"), {256: "<|im_start|>"})
    '<|im_start|>hi'
    """
    parts: list[str] = []
    run: list[int] = []
    for t in token_ids:
        if t in markers:
            parts += [engine.decode(run, skip_special_tokens=True), markers[t]]
            run = []
        else:
            run.append(t)
    parts.append(engine.decode(run, skip_special_tokens=True))
    return "".join(parts)
