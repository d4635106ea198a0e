"""Reasoning parsers: split the thinking a reply wrote from the rest (``qwen3``, ``deepseek_r1``,
``mistral``: vLLM's ``--reasoning-parser`` names; gpt-oss's ``openai_gptoss`` is in :mod:`.harmony`)."""

from __future__ import annotations

from typing import ClassVar

from .base import held

__all__ = ["DeepSeekR1ReasoningParser", "MistralReasoningParser", "Qwen3ReasoningParser", "ReasoningParser"]


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

    def certain(self, text: str) -> tuple[str, str | None]:
        """What ``text``, the start of a streamed reply, fixes of :meth:`split`'s answer however the
        reply goes on: the start of the reasoning, and the start of the rest (``None`` while not even
        that is known). The default fixes nothing: the whole reply is split when it ends."""
        return "", None


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

    def certain(self, text: str) -> tuple[str, str | None]:
        end, call = text.find(self._END), text.find("<tool_call>")
        stripped = text.lstrip()
        if self._START.startswith(stripped):
            return "", None  # whether the reply opens with <think> is not known yet
        opened = stripped.startswith(self._START)
        if end < 0 and not opened:
            return "", None  # all answer unless a </think> comes: not known until one does or the end
        bounds = [i for i in (end, call) if i >= 0 and (opened or i == end or i < end)]
        if not bounds:  # opened, still thinking
            body = held(text, [self._END, "<tool_call>"])
            return body[body.find(self._START) + len(self._START) :], None
        cut = min(bounds)
        head = text[:cut]
        start = head.find(self._START)
        after = text[cut + len(self._END) :] if cut == end else text[cut:]
        return (head[start + len(self._START) :] if start >= 0 else head), held(after, [self._END]).replace(
            self._END, ""
        ).lstrip()


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

    def certain(self, text: str) -> tuple[str, str | None]:
        _, mark, after = text.partition("<think>")
        if not mark:
            return "", None  # a <think> to come would drop all before it
        reasoning, closed, content = after.partition("</think>")
        return (reasoning, content) if closed else (held(after, ["</think>"]), None)


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

    def certain(self, text: str) -> tuple[str, str | None]:
        before, mark, after = text.partition(self._START)
        if not mark:
            return "", held(text, [self._START])
        reasoning, closed, rest = after.partition(self._END)
        return (reasoning, before + rest) if closed else (held(after, [self._END]), before)
