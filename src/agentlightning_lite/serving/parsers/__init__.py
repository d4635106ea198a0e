"""Tool-call and reasoning parsers by vLLM's names (``--tool-call-parser``, ``--reasoning-parser``).

What ``vllm serve --tool-call-parser X --reasoning-parser Y`` reads, ``PolicyServer(tool_parser=X,
reasoning_parser=Y)`` (and ``agl-lite serve --tool-call-parser X --reasoning-parser Y``) reads too:
:data:`TOOL_PARSERS` and :data:`REASONING_PARSERS` name them; :func:`reply_parser` combines one of each
(the reasoning is split off first, the tool calls are read from the rest); :func:`detect` picks both
from a chat template (``"auto"``); :func:`parse` reads one reply, to check what a model writes. Every
reading of a format is here, one module per format family; each reads a whole reply and, streamed, a
reply piece by piece (:meth:`ModelReplyParser.stream`), giving what each piece makes certain.

>>> from agentlightning_lite.serving import parsers
>>> reply = parsers.parse("<think>Weather: ask the tool.</think><tool_call>\\n<function=get_weather>\\n"
...                       "<parameter=city>\\nParis\\n</parameter>\\n</function>\\n</tool_call>",
...                       tool_parser="qwen3_coder", reasoning_parser="qwen3")
>>> reply.reasoning, reply.content, reply.calls
('Weather: ask the tool.', None, [('get_weather', {'city': 'Paris'})])
"""

from __future__ import annotations

from .base import Call, ToolParser, coerce, fix_types
from .combined import ModelReplyParser, ReplyStream, StreamMismatchError
from .detect import auto_parser, detect, template_renders_tools
from .reasoning import ReasoningParser
from .registry import REASONING_PARSERS, TOOL_PARSERS, parse, reply_parser
from .results import ParsedReply, ReplyDelta, ToolCallDelta

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "Call",
    "ModelReplyParser",
    "ParsedReply",
    "ReasoningParser",
    "ReplyDelta",
    "ReplyStream",
    "StreamMismatchError",
    "ToolCallDelta",
    "ToolParser",
    "auto_parser",
    "coerce",
    "detect",
    "fix_types",
    "parse",
    "reply_parser",
    "template_renders_tools",
]
