# ruff: noqa: RUF001, RUF002  (DeepSeek's markers are written with full-width bars)
"""Tool-call formats whose arguments are JSON: ``llama3_json``, ``mistral``, ``deepseek_v31``, ``kimi_k2``
(vLLM's names, and vLLM's rules for what is content and what a malformed call does, save where a
docstring says otherwise; ``hermes`` is in :mod:`.hermes`)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .base import Call, ToolParser, alphanumeric_id, fix_types, held, tool_properties

__all__ = [
    "DeepSeekV31ToolParser",
    "KimiK2ToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
]

_DECODER = json.JSONDecoder()


def _obj_call(obj: Any, tools: Sequence[dict[str, Any]] | None) -> Call | None:
    """``{"name": ..., "arguments"|"parameters": {...}}`` as a call, if it is one."""
    if not isinstance(obj, dict) or not ToolParser.named(obj.get("name")):
        return None
    if "arguments" not in obj and "parameters" not in obj:
        return None
    args = ToolParser.json_args(obj["arguments"] if "arguments" in obj else obj["parameters"])
    return None if args is None else (obj["name"], args)


class Llama3JsonToolParser(ToolParser):
    """Llama 3.x JSON calls: ``{"name": ..., "parameters": {...}}`` (or ``"arguments"``), several
    separated by ``;``, optionally after ``<|python_tag|>``.

    As vLLM does, every JSON object in the reply must be a call: one that is not (a missing key, broken
    JSON) leaves the whole reply as content; with calls there is no content. Arguments given as JSON
    text are read as the object they spell (vLLM passes the text on as a JSON string). So nothing of a
    streamed reply is certain before it ends.

    >>> Llama3JsonToolParser().read('{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
    ...                             None)
    (None, [('f', {'x': 1}), ('g', {})])
    """

    name = "llama3_json"
    special_tokens = True
    markers = ("<|python_tag|>",)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        plain = text.replace("<|python_tag|>", "")
        if "{" not in plain:
            return (plain or None), []
        calls: list[Call] = []
        end = -1
        for m in re.finditer(r"\{", plain):
            if m.start() < end:
                continue
            try:
                obj, n = _DECODER.raw_decode(plain[m.start() :])
            except ValueError:
                return plain, []
            end = m.start() + n
            call = _obj_call(obj, tools)
            if call is None:
                return plain, []
            calls.append(call)
        return (None, calls) if calls else (plain, [])


class MistralToolParser(ToolParser):
    """Mistral: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (tokenizers before v11) and
    ``[TOOL_CALLS]name[ARGS]{...}`` (v11 on; ``[TOOL_CALLS]name{...}`` too, and
    ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}``, the form Mistral Small 3.2's template writes earlier
    calls in), one ``[TOOL_CALLS]`` per call. The text before the first ``[TOOL_CALLS]`` is the content
    (none when only whitespace); a call that cannot be read leaves the whole reply as content (vLLM
    keeps the text after the marker).
    Call ids are 9 letters and digits, as vLLM's: Mistral's chat templates reject any other id when
    the call comes back in the history. Streamed, the content before ``[TOOL_CALLS]`` is sent as it
    comes; the calls when the reply ends (a later call that cannot be read makes them all content).

    >>> MistralToolParser().read('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', None)
    (None, [('get_weather', {'city': 'Paris'})])
    >>> len(MistralToolParser().call_id())
    9
    """

    name = "mistral"
    special_tokens = True
    _MARK = "[TOOL_CALLS]"
    markers = (_MARK,)

    def call_id(self) -> str:
        return alphanumeric_id(9)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        if self._MARK not in text:
            return text, []
        before, *segments = text.split(self._MARK)
        calls = self._calls([s for s in segments if s.strip()], tools)
        if not calls:
            return text, []
        return ((before.strip() and before) or None), calls

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        before = held(text.partition(self._MARK)[0], [self._MARK])
        return (before if before.strip() else ""), []

    def _calls(self, segments: list[str], tools: Sequence[dict[str, Any]] | None) -> list[Call]:
        if not segments:
            return []
        first = segments[0].strip()
        if first.startswith(("[", "{")):  # before v11: one JSON array (or object) of calls
            try:
                obj, _ = _DECODER.raw_decode(first)
            except ValueError:
                return []
            found = [_obj_call(o, tools) for o in (obj if isinstance(obj, list) else [obj])]
            return [c for c in found if c is not None] if found and all(found) else []
        calls: list[Call] = []
        for seg in segments:
            m = re.match(r"\s*([^\[{\s]+)\s*(?:\[CALL_ID\][^\[{]*)?(?:\[ARGS\])?\s*", seg)
            if m is None or not self.named(m.group(1)):
                return []
            try:
                args, _ = _DECODER.raw_decode(seg[m.end() :])
            except ValueError:
                return []
            if not isinstance(args, dict):
                return []
            calls.append((m.group(1), fix_types(args, tool_properties(tools, m.group(1)))))
        return calls


class DeepSeekV31ToolParser(ToolParser):
    """DeepSeek V3.1: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{args}``
    ``<｜tool▁call▁end｜>...
    <｜tool▁calls▁end｜>``. The content is the text before ``<｜tool▁calls▁begin｜>``; a call whose
    arguments are not a JSON object, or that is not closed, is dropped (vLLM passes its text on), and a
    reply with no call left stays content whole. Streamed, each call is sent when it closes.

    >>> DeepSeekV31ToolParser().read('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{"x": 1}'
    ...                              '<｜tool▁call▁end｜><｜tool▁calls▁end｜>', None)
    (None, [('f', {'x': 1})])
    """

    name = "deepseek_v31"
    special_tokens = True
    _BEGIN = "<｜tool▁calls▁begin｜>"
    markers = (_BEGIN, "<｜tool▁call▁begin｜>")
    _CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.S)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        if self._BEGIN not in text:
            return text, []
        calls: list[Call] = []
        for m in self._CALL.finditer(text):
            name, args = m.group(1).strip(), self.json_args(m.group(2))
            if args is not None and self.named(name):
                calls.append((name, args))
        if not calls:
            return text, []
        return (text[: text.index(self._BEGIN)] or None), calls

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        before, begun, _ = text.partition(self._BEGIN)
        if not begun:
            return held(before, [self._BEGIN]), []
        return before, self.read(text, tools)[1]  # the closed calls: an open one does not match yet


class KimiK2ToolParser(ToolParser):
    """Kimi K2: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>
    {...}<|tool_call_end|><|tool_calls_section_end|>``. The content is the text before the section (the
    text after it is dropped, as vLLM does); arguments are typed by the tool's schema. A call whose
    arguments are not a JSON object is dropped (vLLM fails on it); a reply with none left stays content.
    Streamed, each call is sent when it closes.

    >>> KimiK2ToolParser().read('On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.f:0'
    ...                         '<|tool_call_argument_begin|>{"x": 1}<|tool_call_end|>'
    ...                         '<|tool_calls_section_end|>', None)
    ('On it.', [('f', {'x': 1})])
    """

    name = "kimi_k2"
    special_tokens = True
    _BEGIN, _END = "<|tool_calls_section_begin|>", "<|tool_call_end|>"
    markers = (_BEGIN, "<|tool_call_begin|>")
    _CALL = re.compile(
        r"<\|tool_call_begin\|>\s*(?P<id>[^<]+:\d+)\s*<\|tool_call_argument_begin\|>(?P<args>.*?)"
        r"(?:<\|tool_call_end\|>|(?=<\|tool_calls_section_end\|>)|\Z)",
        re.S,
    )

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        if self._BEGIN not in text:
            return text, []
        calls: list[Call] = []
        for m in self._CALL.finditer(text):
            name = m.group("id").strip().split(":")[0].removeprefix("functions.")
            args = self.json_args(m.group("args").strip())
            if args is not None and self.named(name):
                calls.append((name, fix_types(args, tool_properties(tools, name))))
        content = text[: text.index(self._BEGIN)]
        return ((content.strip() and content) or None) if calls else text, calls

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        before, begun, _ = text.partition(self._BEGIN)
        before = before if begun else held(before, [self._BEGIN])
        content = before if before.strip() else ""  # only whitespace: no content if calls follow
        if not begun:
            return content, []
        closed = [
            m for m in self._CALL.finditer(text) if m.end() < len(text) or m.group(0).endswith(self._END)
        ]
        return content, self.read(text[: closed[-1].end()], tools)[1] if closed else []
