"""gpt-oss's Harmony format: its messages (:func:`harmony_messages`), the ``analysis`` channel as the
reasoning (vLLM's ``openai_gptoss`` reasoning parser) and messages to ``functions.NAME`` as tool calls
(vLLM's ``openai`` tool parser)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from .base import Call, ToolParser, held
from .reasoning import ReasoningParser

__all__ = ["GptOssReasoningParser", "HarmonyToolParser", "Message", "harmony_messages"]

# what ends a message's text: one of its end tokens, or the next message's <|start|>
_ENDS = ("<|end|>", "<|call|>", "<|return|>")
_STOPS = (*_ENDS, "<|start|>")


class Message(NamedTuple):
    """One Harmony message: its channel, recipient (``functions.NAME`` for a tool call), content
    type, text, and where it lies in the reply."""

    channel: str | None
    recipient: str | None
    content_type: str | None
    text: str
    span: tuple[int, int]


_MESSAGE = re.compile(
    r"(?:<\|start\|>)?(?P<header>(?:(?!<\|message\|>|<\|start\|>).)*)<\|message\|>"
    r"(?P<body>.*?)(?:<\|end\|>|<\|call\|>|<\|return\|>|(?=<\|start\|>)|\Z)",
    re.S,
)


def harmony_messages(text: str) -> list[Message]:
    """The messages of a gpt-oss reply written in Harmony (decoded with its special tokens).

    >>> [(m.channel, m.recipient, m.text) for m in harmony_messages(
    ...     "<|channel|>analysis<|message|>Think.<|end|>"
    ...     "<|start|>assistant<|channel|>final<|message|>Hi<|return|>")]
    [('analysis', None, 'Think.'), ('final', None, 'Hi')]
    """
    out = []
    for m in _MESSAGE.finditer(text):
        header = m.group("header")
        channel = re.search(r"<\|channel\|>\s*([\w.-]+)", header)
        recipient = re.search(r"\bto=([^\s<]+)", header)
        ctype = re.search(r"(?:<\|constrain\|>|\s)(\w*json\w*)\s*$", header)
        out.append(
            Message(
                channel.group(1) if channel else None,
                recipient.group(1) if recipient else None,
                ctype.group(1) if ctype else None,
                m.group("body"),
                m.span(),
            )
        )
    return out


def _is_content(m: Message) -> bool:
    return m.channel == "final" or (m.channel == "commentary" and m.recipient is None)


def _is_thought(m: Message) -> bool:
    return m.channel == "analysis" and m.recipient is None


def _closed(m: Message, text: str) -> bool:
    """Whether message ``m`` of ``text`` (the start of a reply) is whole: its end token is written, or
    the next message has begun; else its text may grow."""
    return m.span[1] < len(text) or text.endswith(_ENDS, 0, m.span[1])


def _joined(texts: Sequence[str]) -> str:
    return "\n".join(t for t in texts if t)


def _sure_text(m: Message, text: str) -> str:
    """The part of ``m``'s text that stays its text however ``text`` goes on."""
    return m.text if _closed(m, text) else held(m.text, _STOPS)


class GptOssReasoningParser(ReasoningParser):
    """gpt-oss (Harmony): the ``analysis`` channel is the reasoning (its messages joined by newlines);
    the rest is the reply without those messages.

    >>> GptOssReasoningParser().split("<|channel|>analysis<|message|>Add.<|end|>"
    ...                               "<|start|>assistant<|channel|>final<|message|>4")
    ('Add.', '<|start|>assistant<|channel|>final<|message|>4')
    """

    name = "openai_gptoss"
    special_tokens = True

    def split(self, text: str) -> tuple[str | None, str]:
        msgs = harmony_messages(text)
        if not msgs:
            return None, text
        thought = [m for m in msgs if _is_thought(m)]
        rest, last = [], 0
        for m in thought:
            rest.append(text[last : m.span[0]])
            last = m.span[1]
        rest.append(text[last:])
        return ("\n".join(m.text for m in thought if m.text) or None), "".join(rest)

    def certain(self, text: str) -> tuple[str, str | None]:
        msgs = harmony_messages(text)
        if not msgs:
            return "", None  # no message yet: all of it stays the rest, or the messages are read
        reasoning = _joined([_sure_text(m, text) for m in msgs if _is_thought(m)])
        final = msgs[-1]
        # the text after the last whole message begins the next one, which may be thinking: held back
        end = final.span[1] if _closed(final, text) else final.span[0] if _is_thought(final) else len(text)
        rest, last = [], 0
        for m in msgs:
            if _is_thought(m) and m.span[1] <= end:
                rest.append(text[last : m.span[0]])
                last = m.span[1]
        rest.append(text[last:end])
        return reasoning, "".join(rest)


class HarmonyToolParser(ToolParser):
    """gpt-oss (Harmony, vLLM's ``openai``): a message to ``functions.NAME`` is a call (its JSON text
    the arguments), the ``final`` channel (and ``commentary`` to no one) the content, joined by
    newlines; ``analysis`` is reasoning (see :class:`GptOssReasoningParser`), other messages are dropped.

    >>> HarmonyToolParser().read("<|channel|>commentary to=functions.f <|constrain|>json<|message|>"
    ...                          '{"x": 1}<|call|>', None)
    (None, [('f', {'x': 1})])
    """

    name = "openai"
    special_tokens = True
    markers = ("to=functions.",)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        msgs = harmony_messages(text)
        if not msgs:
            return text, []
        return self.content_of(msgs), self._calls(msgs)

    def _calls(self, msgs: Sequence[Message]) -> list[Call]:
        calls: list[Call] = []
        for m in msgs:
            if m.recipient is None or not m.recipient.startswith("functions."):
                continue
            name = m.recipient.removeprefix("functions.")
            try:
                args: Any = json.loads(m.text) if m.text.strip() else {}
            except ValueError:
                continue
            if isinstance(args, dict) and self.named(name):
                calls.append((name, args))
        return calls

    def content_only(self, text: str) -> str | None:
        msgs = harmony_messages(text)
        return self.content_of(msgs) if msgs else text

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        msgs = harmony_messages(text)
        content = _joined([_sure_text(m, text) for m in msgs if _is_content(m)])
        return content, self._calls([m for m in msgs if _closed(m, text)])

    def certain_content_only(self, text: str) -> str:
        return self.certain(text, None)[0]

    @staticmethod
    def content_of(msgs: Sequence[Message]) -> str | None:
        return "\n".join(m.text for m in msgs if _is_content(m) and m.text) or None
