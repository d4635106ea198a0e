"""The reply parsers by vLLM's names (``--tool-call-parser``, ``--reasoning-parser``):
:data:`TOOL_PARSERS`, :data:`REASONING_PARSERS`, :func:`reply_parser` and :func:`parse`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .base import ToolParser
from .combined import ModelReplyParser
from .harmony import GptOssReasoningParser, HarmonyToolParser
from .hermes import HermesToolParser
from .json_tools import DeepSeekV31ToolParser, KimiK2ToolParser, Llama3JsonToolParser, MistralToolParser
from .reasoning import (
    DeepSeekR1ReasoningParser,
    MistralReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)
from .results import ParsedReply
from .text_tools import Glm45ToolParser, PythonicToolParser, Qwen3CoderToolParser

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "parse", "reply_parser"]

#: tool-call parsers by vLLM's ``--tool-call-parser`` name
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    p.name: p
    for p in (
        HermesToolParser,
        Qwen3CoderToolParser,
        Llama3JsonToolParser,
        PythonicToolParser,
        MistralToolParser,
        DeepSeekV31ToolParser,
        Glm45ToolParser,
        KimiK2ToolParser,
        HarmonyToolParser,
    )
}
#: reasoning parsers by vLLM's ``--reasoning-parser`` name (``gpt_oss``: another name of ``openai_gptoss``)
REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "qwen3": Qwen3ReasoningParser,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "mistral": MistralReasoningParser,
    "openai_gptoss": GptOssReasoningParser,
    "gpt_oss": GptOssReasoningParser,
}


def _pick(kind: str, name: str, table: dict[str, Any]) -> Any:
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}: one of {', '.join(sorted(table))} (or 'auto')")
    return table[name]()


def reply_parser(tool_parser: str = "hermes", reasoning_parser: str | None = None) -> ModelReplyParser:
    """The reply parser of ``tool_parser`` and ``reasoning_parser`` (vLLM's names; ``None``: no
    reasoning). ``ValueError`` naming the known ones for another name.

    >>> reply_parser("qwen3_coder", "qwen3")
    ModelReplyParser(tool_parser='qwen3_coder', reasoning_parser='qwen3')
    """
    tool = _pick("tool parser", tool_parser, TOOL_PARSERS)
    reasoning = (
        None if reasoning_parser is None else _pick("reasoning parser", reasoning_parser, REASONING_PARSERS)
    )
    return ModelReplyParser(tool, reasoning)


def parse(
    text: str,
    tool_parser: str = "hermes",
    reasoning_parser: str | None = None,
    tools: Sequence[dict[str, Any]] | None = None,
) -> ParsedReply:
    """Read one reply as ``vllm serve --tool-call-parser tool_parser --reasoning-parser
    reasoning_parser`` would: its content, reasoning and tool calls (``.calls``: ``(name, arguments
    dict)`` pairs; ``.tool_calls``: OpenAI's shape). ``tools``: the tools offered (calls to others are
    not calls; ``None``: any name is taken). Give it the reply decoded with its special tokens for
    formats whose markers are special tokens (Harmony, Kimi, Mistral, DeepSeek).

    >>> parse('[get_weather(city="Paris", days=2)]', "pythonic").calls
    [('get_weather', {'city': 'Paris', 'days': 2})]
    >>> parse("<think>Easy.</think>4", reasoning_parser="qwen3")
    ParsedReply(content='4', reasoning='Easy.', tool_calls=[])
    """
    return reply_parser(tool_parser, reasoning_parser).read(text, tools)
