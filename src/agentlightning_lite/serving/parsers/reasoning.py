"""Reasoning parsers: split the thinking a reply wrote from the rest (``qwen3``, ``deepseek_r1``,
``mistral``, ``openai_gptoss``: vLLM's ``--reasoning-parser`` names), and gpt-oss's Harmony messages,
which the ``openai`` tool parser reads too."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

from .base import Call, ToolParser

__all__ = [
    "DeepSeekR1ReasoningParser",
    "GptOssReasoningParser",
    "HarmonyToolParser",
    "MistralReasoningParser",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "harmony_messages",
]


class ReasoningParser:
    """One model family's way of writing its thinking. Subclasses set ``name`` and implement
    :meth:`split`; ``special_tokens``: its markers are special tokens (read from the reply decoded with
    them); ``tokens``: its marker texts that a tokenizer may hold as single tokens (kept in the decode
    where the served tokenizer marks them special)."""

    name: ClassVar[str] = ""
    special_tokens: ClassVar[bool] = False
    tokens: ClassVar[tuple[str, ...]] = ()

    def split(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, rest)``: the thinking (``None`` when none) and the text after it."""
        raise NotImplementedError


class Qwen3ReasoningParser(ReasoningParser):
    """``<think>...</think>`` then the answer (Qwen3, QwQ, GLM-4.5's thinking, Kimi's).

    The opening tag may be in the prompt (templates that open the thinking for the model), so a reply
    with ``</think>`` is reasoning up to it whatever comes before; a ``<tool_call>`` before any
    ``</think>`` ends the thinking too (as vLLM's Qwen3 parser). A reply without ``</think>`` is all
    reasoning when it starts with ``<think>`` (cut short while thinking), else all answer (thinking
    turned off; vLLM's reads it as all reasoning unless the prompt closed the thinking). Whitespace at
    the start of the answer is dropped (vLLM keeps it), and so is a stray second ``</think>``.

    >>> Qwen3ReasoningParser().split("<think>\\n2+2 is 4.\\n</think>\\n\\n4")
    ('\\n2+2 is 4.\\n', '4')
    >>> Qwen3ReasoningParser().split("It is 4.")
    (None, 'It is 4.')
    """

    name = "qwen3"
    tokens = ("<think>", "</think>")
    _START, _END = "<think>", "</think>"

    def split(self, text: str) -> tuple[str | None, str]:
        end, call = text.find(self._END), text.find("<tool_call>")
        opened = text.lstrip().startswith(self._START)
        if 0 <= call and (call < end or (end < 0 and opened)):
            head, rest = text[:call], text[call:].replace(self._END, "")  # the call ends the thinking
        elif end >= 0:  # a second </think> is dropped too, as vLLM's parser does
            head, rest = text[:end], text[end + len(self._END) :].replace(self._END, "")
        elif opened:
            head, rest = text, ""
        else:
            return None, text
        start = head.find(self._START)
        reasoning = head[start + len(self._START) :] if start >= 0 else head
        return (reasoning or None), rest.lstrip()


class DeepSeekR1ReasoningParser(ReasoningParser):
    """DeepSeek-R1's rules (vLLM's ``deepseek_r1``): the text after ``<think>`` when there is one (its
    prompt opens the thinking, so usually there is none), up to ``</think>``, is the reasoning, the
    rest the answer; without ``</think>`` the whole reply is reasoning.

    >>> DeepSeekR1ReasoningParser().split("Let me add.</think>The sum is 4.")
    ('Let me add.', 'The sum is 4.')
    >>> DeepSeekR1ReasoningParser().split("Still thinking")
    ('Still thinking', '')
    """

    name = "deepseek_r1"
    tokens = ("<think>", "</think>")

    def split(self, text: str) -> tuple[str | None, str]:
        _, mark, after = text.partition("<think>")
        text = after if mark else text
        if "</think>" not in text:
            return (text or None), ""
        reasoning, _, content = text.partition("</think>")
        return (reasoning or None), content


class MistralReasoningParser(ReasoningParser):
    """Magistral, Ministral 3 Reasoning, Devstral (vLLM's ``mistral``): ``[THINK]...[/THINK]`` then the
    answer, the markers being control tokens (read from the reply decoded with them). As vLLM's: a reply
    without ``[THINK]`` is all answer; one cut short inside the thinking (no ``[/THINK]``) is all
    reasoning; text before ``[THINK]`` stays answer.

    >>> MistralReasoningParser().split("[THINK]2+2 is 4.[/THINK]The sum is 4.")
    ('2+2 is 4.', 'The sum is 4.')
    >>> MistralReasoningParser().split("The sum is 4.")
    (None, 'The sum is 4.')
    >>> MistralReasoningParser().split("[THINK]Still adding")
    ('Still adding', '')
    """

    name = "mistral"
    special_tokens = True
    _START, _END = "[THINK]", "[/THINK]"

    def split(self, text: str) -> tuple[str | None, str]:
        before, mark, after = text.partition(self._START)
        if not mark:
            return None, text
        reasoning, closed, rest = after.partition(self._END)
        return (reasoning or None), before + rest if closed else before


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
        thought = [m for m in msgs if m.channel == "analysis" and m.recipient is None]
        rest, last = [], 0
        for m in thought:
            rest.append(text[last : m.span[0]])
            last = m.span[1]
        rest.append(text[last:])
        return ("\n".join(m.text for m in thought if m.text) or None), "".join(rest)


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
        return self.content_of(msgs), calls

    def content_only(self, text: str) -> str | None:
        msgs = harmony_messages(text)
        return self.content_of(msgs) if msgs else text

    @staticmethod
    def content_of(msgs: Sequence[Message]) -> str | None:
        return "\n".join(m.text for m in msgs if _is_content(m) and m.text) or None
