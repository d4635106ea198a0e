"""Tool calls in an LLM span's output, and which of them a tool's run answers.

One reading of the tool calls a model asked for (:func:`tool_calls`) and one rule for the call a
tool's run answers (:meth:`PendingCalls.claim`), shared by the framework adapters (which give tool
spans their ``tool_call_id``) and by AIR (which finds the LLM call behind a tool span).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ._json import json_or_text

__all__ = ["ASK_SLACK_S", "PendingCalls", "ToolCall", "tool_calls"]

#: seconds a call may be recorded as asked after its tool started (clocks of event handlers differ)
ASK_SLACK_S = 0.05

#: keys under which an output nests messages that may hold tool calls (a chat completion's choices)
_NESTED = ("choices", "message", "messages")


@dataclass(frozen=True)
class ToolCall:
    """One tool call a model asked for: its id, the tool's name, the arguments (decoded JSON, or text)."""

    id: str | None
    name: str | None
    arguments: Any


def _tool_call(c: dict[str, Any]) -> ToolCall:
    f = c.get("function")
    fn = f if isinstance(f, dict) else c
    args = fn.get("arguments", fn.get("args"))
    cid = c.get("id")
    name = fn.get("name")
    return ToolCall(
        cid if isinstance(cid, str) else None,
        name if isinstance(name, str) else None,
        json_or_text(args),
    )


def tool_calls(output: Any) -> list[ToolCall]:
    """The tool calls in an LLM span's output, in the order asked.

    Reads an assistant message's ``tool_calls`` (OpenAI ``{id, function: {name, arguments}}`` or flat
    ``{id, name, arguments | args}``), nested under a chat completion's ``choices`` / ``message``, or
    in a list of such outputs.

    >>> call = {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1}'}}
    >>> out = {"role": "assistant", "tool_calls": [call]}
    >>> tool_calls(out)
    [ToolCall(id='c1', name='add', arguments={'a': 1})]
    >>> tool_calls({"choices": [{"message": out}]}) == tool_calls([out]) == tool_calls(out)
    True
    """
    found: list[ToolCall] = []
    stack = [output]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            calls = item.get("tool_calls")
            if isinstance(calls, list):
                found.extend(_tool_call(c) for c in calls if isinstance(c, dict))
            stack.extend(reversed([item[k] for k in _NESTED if k in item]))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return found


class PendingCalls:
    """Tool calls asked for and not yet answered by a tool's run, in the order asked.

    :meth:`claim` takes the call a tool's run answers: of the calls with the tool's name (asked
    before the tool started, when times are known), the first whose arguments equal the tool's
    (a tool whose arguments are unknown takes the first), else the first; a claimed call is
    answered and not offered again.

    >>> pending = PendingCalls()
    >>> pending.add({"tool_calls": [{"id": "c1", "name": "add", "args": {"a": 1}},
    ...                             {"id": "c2", "name": "add", "args": {"a": 2}}]})
    >>> pending.claim("add", '{"a": 2}').id, pending.claim("add", {"a": 9}).id, pending.claim("add", None)
    ('c2', 'c1', None)
    """

    def __init__(self) -> None:
        self._calls: list[tuple[float | None, ToolCall]] = []

    def add(self, output: Any, asked_at: float | None = None) -> None:
        """Add the tool calls in an LLM span's output (``asked_at``: when that call ended)."""
        self._calls.extend((asked_at, c) for c in tool_calls(output))

    def claim(self, name: str, arguments: Any, started_at: float | None = None) -> ToolCall | None:
        """The call that the run of tool ``name`` with ``arguments`` (JSON text or decoded) answers."""
        args = json_or_text(arguments)
        eligible = [
            i
            for i, (asked_at, c) in enumerate(self._calls)
            if c.name == name
            and (started_at is None or asked_at is None or asked_at <= started_at + ASK_SLACK_S)
        ]
        if not eligible:
            return None
        same = [i for i in eligible if args is None or self._calls[i][1].arguments == args]
        return self._calls.pop(same[0] if same else eligible[0])[1]

    def __len__(self) -> int:
        return len(self._calls)

    def __iter__(self) -> Iterator[ToolCall]:
        return (c for _, c in self._calls)
