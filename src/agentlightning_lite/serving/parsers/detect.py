# ruff: noqa: RUF002  (DeepSeek's markers are written with full-width bars)
"""Which parsers a model's chat template points to: :func:`detect` reads its markers, :func:`auto_parser`
builds the reply parser (``"auto"``), :func:`template_renders_tools` says whether the template renders
the tools itself (else the server's own tool prompt asks for Hermes blocks)."""

from __future__ import annotations

import logging

from .combined import ModelReplyParser
from .registry import reply_parser

__all__ = ["auto_parser", "detect", "template_renders_tools"]

logger = logging.getLogger(__package__)  # the package's logger, as its users configure it


def template_renders_tools(chat_template: str | dict[str, str] | None) -> bool:
    """Whether a chat template renders a ``tools`` argument itself; when it does not, the server
    describes the tools in the system prompt (:data:`~..chat_format.TOOLS_PROMPT`, asking for
    ``<tool_call>`` blocks) and writes earlier calls that way, and ``tool_parser="auto"`` reads replies
    with ``hermes``.

    >>> template_renders_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    True
    >>> template_renders_tools("{% for m in messages %}{{ m.content }}{% endfor %}")
    False
    """
    if isinstance(chat_template, dict):
        chat_template = " ".join(str(v) for v in chat_template.values())
    return chat_template is not None and "tools" in chat_template


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
