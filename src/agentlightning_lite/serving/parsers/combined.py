"""One model family's reply reader: a tool parser and (maybe) a reasoning parser, reading a whole reply
(:meth:`ModelReplyParser.read`) or a streamed one piece by piece (:class:`ReplyStream`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .base import Call, ToolParser, held_end_markers, strip_end_markers
from .reasoning import ReasoningParser
from .results import ParsedReply, ReplyDelta, ToolCallDelta

__all__ = ["ModelReplyParser", "ReplyStream", "StreamMismatchError"]


class ModelReplyParser:
    """A :class:`~agentlightning_lite.serving.reply.ReplyParser` made of one tool parser and (maybe)
    one reasoning parser: the reasoning is split off first, the calls are read from the rest.

    ``name``: the tool parser's name; ``reasoning_parser``: the reasoning parser's (``None``: replies
    have no reasoning); ``special_tokens``: replies are read as decoded with their special tokens (the
    format's markers are special tokens); ``marker_tokens``: the marker texts of both parsers that a
    tokenizer may hold as single tokens (where the served tokenizer marks them special, the reply is
    decoded keeping them: :func:`~agentlightning_lite.serving.reply.special_markers`); ``picked``:
    how the parsers were chosen (``"auto"`` from a chat template, else ``"named"``).

    >>> from agentlightning_lite.serving.parsers import reply_parser
    >>> p = reply_parser("hermes", "deepseek_r1")
    >>> r = p.parse('Sum.</think><tool_call>{"name": "add", "arguments": {"a": 2}}</tool_call>',
    ...             [{"type": "function", "function": {"name": "add"}}])
    >>> r.reasoning, r.content, r.calls
    ('Sum.', None, [('add', {'a': 2})])
    >>> bad = reply_parser("hermes").parse("<tool_call>{not json</tool_call>",
    ...                                    [{"type": "function", "function": {"name": "add"}}])
    >>> bad.tool_parse_failed, bad.content, bad.calls  # hermes keeps a block it cannot read as content
    (True, '<tool_call>{not json</tool_call>', [])
    """

    def __init__(self, tool: ToolParser, reasoning: ReasoningParser | None = None, picked: str = "named"):
        self.tool = tool
        self.reasoning = reasoning
        self.name = tool.name
        self.reasoning_parser = reasoning.name if reasoning is not None else None
        self.special_tokens = tool.special_tokens or (reasoning is not None and reasoning.special_tokens)
        self.marker_tokens = tuple(dict.fromkeys((*tool.tokens, *(reasoning.tokens if reasoning else ()))))
        self.picked = picked

    def __repr__(self) -> str:
        return f"ModelReplyParser(tool_parser={self.name!r}, reasoning_parser={self.reasoning_parser!r})"

    def parse(self, text: str, tools: Sequence[dict[str, Any]] | None) -> ParsedReply:
        """Read a reply served with ``tools`` offered (``None``: none were; the reply has no calls)."""
        return self.read(text, tools, with_calls=bool(tools))

    def read(
        self, text: str, tools: Sequence[dict[str, Any]] | None = None, with_calls: bool = True
    ) -> ParsedReply:
        """Read a reply; ``tools=None`` takes calls to any tool, ``with_calls=False`` reads none."""
        if self.special_tokens:
            text = strip_end_markers(text)
        reasoning, rest = self.reasoning.split(text) if self.reasoning is not None else (None, text)
        calls: list[Call] = []
        failed = False
        if not with_calls:
            content = self.tool.content_only(rest)
        else:
            content, calls = self.tool.read(rest, tools)
            failed = not calls and self.tool.has_marker(rest)  # a call marker, no call read
        if not content and (reasoning is not None or rest != text):
            content = None  # all thinking: no answer yet
        return ParsedReply(
            tool_parse_failed=failed,
            content=content,
            reasoning=reasoning,
            tool_calls=[self._openai(self.tool.call_id(), name, args) for name, args in calls],
        )

    def stream(self, tools: Sequence[dict[str, Any]] | None = None, with_calls: bool = True) -> ReplyStream:
        """A reader of one streamed reply, read as :meth:`read` would read it whole.

        >>> from agentlightning_lite.serving.parsers import reply_parser
        >>> s = reply_parser("hermes", "qwen3").stream()
        >>> pieces = ("<think>Add", ".</think>It is", " 4.")
        >>> [s.read_delta(t) for t in pieces]  # doctest: +NORMALIZE_WHITESPACE
        [ReplyDelta(content='', reasoning='Add', tool_calls=[]),
         ReplyDelta(content='It is', reasoning='.', tool_calls=[]),
         ReplyDelta(content=' 4.', reasoning='', tool_calls=[])]
        """
        return ReplyStream(self, tools, with_calls)

    def certain(
        self, text: str, tools: Sequence[dict[str, Any]] | None = None, with_calls: bool = True
    ) -> tuple[str, str, list[Call]]:
        """What ``text``, the start of a reply, fixes of what :meth:`read` gives for the whole reply:
        the start of its reasoning, the start of its content and its first calls."""
        if self.special_tokens:
            text = held_end_markers(text)
        reasoning, rest = self.reasoning.certain(text) if self.reasoning is not None else ("", text)
        if rest is None:
            return reasoning, "", []
        if not with_calls:
            return reasoning, self.tool.certain_content_only(rest), []
        content, calls = self.tool.certain(rest, tools)
        return reasoning, content, calls

    @staticmethod
    def _openai(call_id: str, name: str, args: dict[str, Any]) -> dict[str, Any]:
        arguments = json.dumps(args, ensure_ascii=False)
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class StreamMismatchError(RuntimeError):
    """A parser sent, while a reply streamed, text or a call that the whole reply does not read as:
    a bug of that parser's streaming rules (the message names the parser and what differs)."""


class ReplyStream:
    """One streamed reply, read piece by piece: :meth:`read_delta` takes the next piece of text and
    gives what it made certain (a :class:`~.results.ReplyDelta`: reasoning and content text, and each
    tool call once whole, with its id, name and arguments); :meth:`finish`, at the reply's end, gives
    the rest. Everything given, joined, is what :meth:`ModelReplyParser.read` reads from the whole
    text; :attr:`reply` is that reading, with the ids the stream gave its calls.

    >>> from agentlightning_lite.serving.parsers import reply_parser
    >>> s = reply_parser("hermes").stream()
    >>> s.read_delta('On it. <tool_call>{"name": "f", "arg').content
    'On it.'
    >>> d = s.read_delta('uments": {"x": 1}}</tool_call>')
    >>> d.tool_calls[0].name, d.tool_calls[0].arguments
    ('f', '{"x": 1}')
    >>> s.finish(), s.reply.content
    (ReplyDelta(content='', reasoning='', tool_calls=[]), 'On it.')
    """

    def __init__(self, parser: ModelReplyParser, tools: Sequence[dict[str, Any]] | None, with_calls: bool):
        self.parser = parser
        self.tools = tools
        self.with_calls = with_calls
        #: the text read so far
        self.text = ""
        self._reasoning = ""
        self._content = ""
        self._calls: list[tuple[str, str, str]] = []  # (id, name, arguments) of the calls sent
        self._reply: ParsedReply | None = None

    def read_delta(self, delta: str) -> ReplyDelta:
        """Read the next piece of the reply; what it made certain."""
        if self._reply is not None:
            raise RuntimeError("this reply stream is finished: start another with parser.stream()")
        self.text += delta
        return self._advance(*self.parser.certain(self.text, self.tools, self.with_calls))

    def finish(self) -> ReplyDelta:
        """End the reply: what the whole text reads as, less what was sent already."""
        if self._reply is not None:
            raise RuntimeError("this reply stream is finished already")
        whole = self.parser.read(self.text, self.tools, self.with_calls)
        out = self._advance(whole.reasoning or "", whole.content or "", whole.calls, final=True)
        ids = [c[0] for c in self._calls]
        whole.tool_calls = [{**c, "id": i} for c, i in zip(whole.tool_calls, ids, strict=True)]
        self._reply = whole
        return out

    @property
    def reply(self) -> ParsedReply:
        """The whole reply, read (after :meth:`finish`), its calls with the ids the stream sent."""
        if self._reply is None:
            raise RuntimeError("the reply is read once the stream is finished: call finish() first")
        return self._reply

    def _more(self, kind: str, sent: str, now: str, final: bool) -> str:
        if now.startswith(sent):
            return now[len(sent) :]
        if not final and sent.startswith(now):
            return ""  # less certain than before: nothing new
        raise StreamMismatchError(
            f"the {self.parser!r} stream sent {kind} {sent!r}, but the reply reads as {now!r} "
            f"(the reply so far: {self.text!r})"
        )

    def _advance(self, reasoning: str, content: str, calls: list[Call], final: bool = False) -> ReplyDelta:
        out = ReplyDelta(
            reasoning=self._more("reasoning", self._reasoning, reasoning, final),
            content=self._more("content", self._content, content, final),
        )
        self._reasoning += out.reasoning
        self._content += out.content
        for i, (name, args) in enumerate(calls):
            arguments = json.dumps(args, ensure_ascii=False)
            if i < len(self._calls):
                if self._calls[i][1:] != (name, arguments):
                    raise StreamMismatchError(
                        f"the {self.parser!r} stream sent call {i} as {self._calls[i][1:]}, but the reply "
                        f"reads it as {(name, arguments)} (the reply so far: {self.text!r})"
                    )
                continue
            call_id = self.parser.tool.call_id()
            self._calls.append((call_id, name, arguments))
            out.tool_calls.append(ToolCallDelta(i, call_id, name, arguments))
        if final and len(calls) < len(self._calls):
            raise StreamMismatchError(
                f"the {self.parser!r} stream sent {len(self._calls)} calls, but the reply has {len(calls)} "
                f"(the reply: {self.text!r})"
            )
        return out
