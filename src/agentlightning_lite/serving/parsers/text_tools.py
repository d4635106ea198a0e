"""Tool-call formats whose arguments are written as text: ``qwen3_coder`` and ``glm45`` (tagged values
typed by the tool's schema), ``pythonic`` (a Python list of calls, read with :mod:`ast`, never run)."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

from .base import Call, ToolParser, fix_types, held, tool_properties

__all__ = ["Glm45ToolParser", "PythonicToolParser", "Qwen3CoderToolParser"]


def _sure_content(text: str, first: re.Match[str] | None, markers: Sequence[str]) -> str:
    """The start of the content, ``text`` being the start of a reply whose content is the text before
    its first call stripped (``first``: that call, when begun), or the whole reply when it has none."""
    if first is not None:
        return text[: first.start()].strip()
    if not text[:1] or text[:1].isspace():
        return ""  # kept (no call) or stripped (a call later): not known yet
    cut = min([i for i in (text.find(m) for m in markers) if i >= 0], default=len(text))
    return held(text[:cut], markers).rstrip()


def _closed_calls(pattern: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """The calls of ``text`` (the start of a reply) that are whole: a later one has begun or their end
    marker is written (``pattern``'s group ``end``)."""
    return [m for m in pattern.finditer(text) if m.end() < len(text) or m.group("end")]


def _trim_newlines(value: str) -> str:
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


class Qwen3CoderToolParser(ToolParser):
    """Qwen3-Coder / Qwen3.5 XML calls: ``<tool_call><function=NAME><parameter=KEY>value</parameter>
    </function></tool_call>``.

    As vLLM's: a ``<function=`` without ``<tool_call>`` is a call too, a parameter ends at
    ``</parameter>`` or at the next ``<parameter=``, one newline is trimmed at each end of a value,
    values are typed by the tool's schema (text when the schema says string or says nothing), a call
    cut short keeps its complete parameters, and a call to a tool not offered is a call too (the agent
    answers it). The content is the text before the first call, stripped; the text after is dropped.
    Streamed, each call is sent when it closes.

    >>> schema = {"properties": {"n": {"type": "integer"}}}
    >>> tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    >>> Qwen3CoderToolParser().read("<tool_call>\\n<function=f>\\n<parameter=n>\\n3\\n</parameter>\\n"
    ...                             "</function>\\n</tool_call>", tools)
    (None, [('f', {'n': 3})])
    """

    name = "qwen3_coder"
    markers = ("<tool_call>", "<function=")
    tokens = ("<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=", "</parameter>")
    _CALL = re.compile(
        r"(?:<tool_call>\s*)?<function=([^>]*)>(.*?)"
        r"(?:(?P<end></function>\s*(?:</tool_call>)?|</tool_call>)|(?=<tool_call>|<function=)|\Z)",
        re.S,
    )
    _PARAM = re.compile(
        r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))", re.S
    )

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        calls: list[Call] = []
        spans: list[tuple[int, int]] = []
        for m in self._CALL.finditer(text):
            spans.append(m.span())
            name = m.group(1).strip()
            body = m.group(2)
            args = {p.group(1).strip(): _trim_newlines(p.group(2)) for p in self._PARAM.finditer(body)}
            if self.named(name):
                calls.append((name, fix_types(args, tool_properties(tools, name))))
        if not spans:
            return text, []
        return (text[: spans[0][0]].strip() or None), calls  # the text after the calls is dropped

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        closed = _closed_calls(self._CALL, text)
        content = _sure_content(text, next(self._CALL.finditer(text), None), self.markers)
        return content, self.read(text[: closed[-1].end()], tools)[1] if closed else []


class Glm45ToolParser(ToolParser):
    """GLM-4.5 / 4.6 / 4.7: ``<tool_call>NAME\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n``
    ``</tool_call>``.

    Values are typed by the tool's schema as vLLM does (text when it says string or nothing); an
    unclosed last call keeps its complete pairs; a call naming a tool not offered is dropped. The
    content is the text before the first call, stripped; the text after is dropped. Streamed, each
    call is sent when it closes.

    >>> Glm45ToolParser().read("Let me look.<tool_call>search\\n<arg_key>q</arg_key>\\n"
    ...                        "<arg_value>vllm</arg_value>\\n</tool_call>", None)
    ('Let me look.', [('search', {'q': 'vllm'})])
    """

    name = "glm45"
    markers = ("<tool_call>",)
    tokens = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
    _CALL = re.compile(r"<tool_call>(.*?)(?:(?P<end></tool_call>)|(?=<tool_call>)|\Z)", re.S)
    _ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.S)

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        calls: list[Call] = []
        spans: list[tuple[int, int]] = []
        for m in self._CALL.finditer(text):
            spans.append(m.span())
            body = m.group(1)
            cut = body.find("<arg_key>")
            name = (body if cut < 0 else body[:cut]).strip()
            args = {a.group(1).strip(): a.group(2) for a in self._ARG.finditer(body)}
            if self.allowed(name, tools):
                calls.append((name, fix_types(args, tool_properties(tools, name))))
        if not spans:
            return text, []
        return (text[: spans[0][0]].strip() or None), calls  # the text after the calls is dropped

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        closed = _closed_calls(self._CALL, text)
        content = _sure_content(text, next(self._CALL.finditer(text), None), self.markers)
        return content, self.read(text[: closed[-1].end()], tools)[1] if closed else []


_LITERALS = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}


def _value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (str, int, float))):
        return node.value
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: _value(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[union-attr]
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values)  # type: ignore[attr-defined]
    if isinstance(node, ast.Name) and node.id in _LITERALS:
        return _LITERALS[node.id]
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.USub, ast.UAdd))
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and not isinstance(node.operand.value, bool)
    ):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    raise ValueError(f"not a literal: {ast.dump(node)}")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("not a function name")


class PythonicToolParser(ToolParser):
    """Pythonic calls (Llama 3.2/4, ToolACE...): the reply is a Python list of calls with keyword
    arguments, ``[get_weather(city="Paris"), get_time()]``, read with :mod:`ast` (nothing is evaluated).

    Values are literals (``true``/``false``/``null`` too; tuples and sets become lists). As vLLM does,
    anything else (text around the list, an argument that is not a literal) leaves the whole reply as
    content; positional arguments are ignored. Streamed, a reply that does not begin with ``[`` is
    content as it comes; a list of calls is read when the reply ends.

    >>> PythonicToolParser().read('[f(a=1, b="x"), g()]', None)
    (None, [('f', {'a': 1, 'b': 'x'}), ('g', {})])
    """

    name = "pythonic"

    def read(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str | None, list[Call]]:
        body = text.strip()
        if not body.startswith("[") or not body.endswith("]"):
            return text, []
        try:
            tree = ast.parse(body, mode="eval").body
            if not isinstance(tree, ast.List) or not tree.elts:
                return text, []
            calls: list[Call] = []
            for node in tree.elts:
                if not isinstance(node, ast.Call):
                    return text, []
                name = _dotted(node.func)
                if not self.named(name):
                    return text, []
                calls.append((name, {k.arg: _value(k.value) for k in node.keywords if k.arg is not None}))
        except (SyntaxError, ValueError, RecursionError):
            return text, []
        return None, calls

    def certain(self, text: str, tools: Sequence[dict[str, Any]] | None) -> tuple[str, list[Call]]:
        start = text.lstrip()[:1]
        return (text if start and start != "[" else ""), []
