# ruff: noqa: RUF002  (DeepSeek's markers are written with full-width bars)
"""Tool-call and reasoning parsers by vLLM's names (``--tool-call-parser``, ``--reasoning-parser``).

What ``vllm serve --tool-call-parser X --reasoning-parser Y`` reads, ``PolicyServer(tool_parser=X,
reasoning_parser=Y)`` (and ``agl-lite serve --tool-call-parser X --reasoning-parser Y``) reads too:
:data:`TOOL_PARSERS` and :data:`REASONING_PARSERS` name them; :func:`reply_parser` combines one of each
(the reasoning is split off first, the tool calls are read from the rest); :func:`detect` picks both
from a chat template (``"auto"``); :func:`parse` reads one reply, to check what a model writes.

>>> from agentlightning_lite.serving import parsers
>>> reply = parsers.parse("<think>Weather: ask the tool.</think><tool_call>\\n<function=get_weather>\\n"
...                       "<parameter=city>\\nParis\\n</parameter>\\n</function>\\n</tool_call>",
...                       tool_parser="qwen3_coder", reasoning_parser="qwen3")
>>> reply.reasoning, reply.content, reply.calls
('Weather: ask the tool.', None, [('get_weather', {'city': 'Paris'})])
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from ..chat_format import template_renders_tools
from ..reply import ParsedReply
from .base import Call, ToolParser, coerce, fix_types, strip_end_markers
from .json_tools import (
    DeepSeekV31ToolParser,
    HermesToolParser,
    KimiK2ToolParser,
    Llama3JsonToolParser,
    MistralToolParser,
)
from .reasoning import (
    DeepSeekR1ReasoningParser,
    GptOssReasoningParser,
    HarmonyToolParser,
    MistralReasoningParser,
    Qwen3ReasoningParser,
    ReasoningParser,
)
from .text_tools import Glm45ToolParser, PythonicToolParser, Qwen3CoderToolParser

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "Call",
    "ModelReplyParser",
    "ReasoningParser",
    "ToolParser",
    "coerce",
    "detect",
    "fix_types",
    "parse",
    "reply_parser",
]

logger = logging.getLogger(__name__)

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


class ModelReplyParser:
    """A :class:`~agentlightning_lite.serving.reply.ReplyParser` made of one tool parser and (maybe)
    one reasoning parser: the reasoning is split off first, the calls are read from the rest.

    ``name``: the tool parser's name; ``reasoning_parser``: the reasoning parser's (``None``: replies
    have no reasoning); ``special_tokens``: replies are read as decoded with their special tokens (the
    format's markers are special tokens); ``marker_tokens``: the marker texts of both parsers that a
    tokenizer may hold as single tokens (where the served tokenizer marks them special, the reply is
    decoded keeping them: :func:`~agentlightning_lite.serving.reply.special_markers`); ``picked``:
    how the parsers were chosen (``"auto"`` from a chat template, else ``"named"``).

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
            tool_calls=[
                {
                    "id": self.tool.call_id(),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
                }
                for name, args in calls
            ],
        )


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


def detect(chat_template: str | dict[str, str] | None) -> tuple[str, str | None]:
    """The ``(tool parser, reasoning parser)`` a chat template's markers point to; ``("hermes", None)``
    when it shows none (what the tool prompt of templates without tools asks for).

    >>> detect("{{'<tool_call>\\n<function=' + tool_call.name + '>'}}{{'<think>\\n'}}")
    ('qwen3_coder', 'qwen3')
    >>> detect("{% for m in messages %}{{ m.content }}{% endfor %}")
    ('hermes', None)
    >>> detect("{{ '[TOOL_CALLS]' + name + '[ARGS]' }}{{ '[THINK]' + block.thinking + '[/THINK]' }}")
    ('mistral', 'mistral')
    """
    t = " ".join(chat_template.values()) if isinstance(chat_template, dict) else chat_template or ""
    think = "<think>" in t
    if "<|channel|>" in t:
        return "openai", "openai_gptoss"
    if "tool_calls_section_begin" in t:
        return "kimi_k2", "qwen3" if think else None
    if "tool▁calls▁begin" in t:
        # DeepSeek-R1 always thinks (deepseek_r1); V3.1 thinks when asked to (qwen3's rules)
        return "deepseek_v31", ("qwen3" if "thinking" in t else "deepseek_r1") if think else None
    if "[TOOL_CALLS]" in t:
        return "mistral", "mistral" if "[THINK]" in t else None
    if "<arg_key>" in t:
        return "glm45", "qwen3" if think else None
    if "<tool_call>" in t:
        return ("qwen3_coder" if "<function=" in t else "hermes"), "qwen3" if think else None
    if "<|python_tag|>" in t or '"parameters"' in t:
        return "llama3_json", None
    return "hermes", "qwen3" if think else None


def auto_parser(
    chat_template: str | dict[str, str] | None,
    tool_parser: str = "auto",
    reasoning_parser: str | None = "auto",
) -> ModelReplyParser:
    """The reply parser for a model with ``chat_template``: ``"auto"`` (for either) is what
    :func:`detect` reads there; the choice and its reason are logged at INFO.

    A template that renders no ``tools`` (DeepSeek-V3.1's) gets the server's own tool prompt, which asks
    for ``<tool_call>`` JSON blocks (and earlier calls are written that way): ``tool_parser="auto"``
    then reads replies with ``hermes``, whatever call markers the template shows. A tool parser named
    for such a template is kept, with a warning that the model is asked for Hermes blocks.

    >>> auto_parser("{% if tools %}{{ '[TOOL_CALLS]' }}{% endif %}", reasoning_parser=None)
    ModelReplyParser(tool_parser='mistral', reasoning_parser=None)
    >>> auto_parser("{{ '<｜tool▁calls▁begin｜>' }}{% if thinking %}<think>{% endif %}")
    ModelReplyParser(tool_parser='hermes', reasoning_parser='qwen3')
    """
    tool_name, reasoning_name = detect(chat_template)
    renders_tools = template_renders_tools(chat_template)
    why = "from the chat template's markers"
    if not renders_tools and tool_name != "hermes":
        why = (
            f"the chat template renders no tools, so the server's own tool prompt asks for <tool_call> "
            f"blocks (its markers point to {tool_name!r})"
        )
        tool_name = "hermes"
    auto = tool_parser == "auto" or reasoning_parser == "auto"
    parser = reply_parser(
        tool_name if tool_parser == "auto" else tool_parser,
        reasoning_name if reasoning_parser == "auto" else reasoning_parser,
    )
    if tool_parser not in ("auto", "hermes") and not renders_tools:
        logger.warning(
            "the chat template renders no tools: the server describes them in its own tool prompt, which "
            "asks the model for <tool_call>{...}</tool_call> blocks (hermes) and writes earlier calls "
            "that way, but replies are read with the %r tool parser as named (docs/models.md)",
            tool_parser,
        )
    if auto:
        parser.picked = "auto"
        logger.info(
            "reply parsers: tool parser %r, reasoning parser %r (auto: %s)",
            parser.name,
            parser.reasoning_parser,
            why,
        )
    return parser


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
