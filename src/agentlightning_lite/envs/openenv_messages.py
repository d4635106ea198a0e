"""The text that passes between the model and an OpenEnv environment: observations rendered for the
model, replies made into actions, MCP tool listings and results, and the server's error frames."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["chat_tools", "is_mcp", "render_observation", "server_error_text", "text_action", "tool_text"]

# the fields every OpenEnv observation has besides its own
_COMMON = ("metadata", "done", "reward")


def render_observation(observation: dict[str, Any]) -> str:
    """The text of an observation for the model: its one text field, else its fields as JSON
    (``metadata`` only when nothing else is there).

    >>> render_observation({"prompt": "Guess a digit.", "metadata": {}})
    'Guess a digit.'
    >>> render_observation({"board": [1, 2], "turn": "x", "metadata": {}})
    '{"board": [1, 2], "turn": "x"}'
    >>> render_observation({"metadata": {"question": "What is a?"}})
    '{"question": "What is a?"}'
    """
    fields = {k: v for k, v in observation.items() if k not in _COMMON and v not in (None, "", [], {})}
    if len(fields) == 1 and isinstance(next(iter(fields.values())), str):
        return str(next(iter(fields.values())))
    shown = fields or observation.get("metadata") or {}
    return json.dumps(shown, default=str) if shown else ""


def text_action(schema: dict[str, Any]) -> Callable[[str], dict[str, Any]] | None:
    """The default ``action_from_reply`` for an action JSON schema: the reply as the action's one
    required string field; ``None`` when the action is not one text field.

    >>> schema = {"title": "GuessAction", "required": ["guess"],
    ...           "properties": {"guess": {"type": "string"}, "metadata": {"type": "object"}}}
    >>> text_action(schema)("7")
    {'guess': '7'}
    >>> text_action({"properties": {"x": {"type": "integer"}}, "required": ["x"]}) is None
    True
    """
    props = {k: v for k, v in (schema.get("properties") or {}).items() if k != "metadata"}
    required = [k for k in schema.get("required") or [] if k != "metadata"]
    strings = [k for k in required if (props.get(k) or {}).get("type") == "string"]
    if len(required) != 1 or len(strings) != 1:
        return None
    field = strings[0]
    return lambda reply: {field: reply}


def server_error_text(data: dict[str, Any]) -> str:
    """An OpenEnv server's error frame as text: its message and code, then each field error it
    carries (a schema rejection names the field that failed and why).

    >>> server_error_text({"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": [
    ...     {"type": "int_parsing", "loc": ["x"], "msg": "Input should be a valid integer", "input": "up"},
    ...     {"type": "missing", "loc": ["y"], "msg": "Field required", "input": {"x": "up"}}]})
    "Invalid message (VALIDATION_ERROR): x: Input should be a valid integer (got 'up'); y: Field required"
    >>> server_error_text({"message": "not a digit: 'five'", "code": "EXECUTION_ERROR"})
    "not a digit: 'five' (EXECUTION_ERROR)"
    """
    text = f"{data.get('message') or 'error'} ({data.get('code') or 'UNKNOWN'})"
    fields = []
    for error in data.get("errors") or []:
        if not isinstance(error, dict):
            fields.append(str(error))
            continue
        where = ".".join(str(part) for part in error.get("loc") or ()) or "the action"
        got = "" if error.get("type") == "missing" or "input" not in error else f" (got {error['input']!r})"
        fields.append(f"{where}: {error.get('msg') or error.get('type')}{got}")
    return f"{text}: {'; '.join(fields)}" if fields else text


def is_mcp(schema: dict[str, Any]) -> bool:
    """Whether an action schema is openenv's MCP actions (``CallToolAction``): tool calls only.

    >>> is_mcp({"title": "CallToolAction", "properties": {}}), is_mcp({"title": "GuessAction"})
    (True, False)
    """
    return schema.get("title") in ("CallToolAction", "ListToolsAction") or "tool_name" in (
        schema.get("properties") or {}
    )


def tool_text(observation: dict[str, Any]) -> tuple[str, bool]:
    """A ``call_tool`` observation as the tool message's text; whether the tool failed.

    >>> tool_text({"result": {"content": [{"type": "text", "text": "apple"}]}})
    ('apple', False)
    >>> tool_text({"error": {"message": "no such key"}})
    ('error: no such key', True)
    """
    error = observation.get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else error
        return f"error: {message}", True
    result = observation.get("result")
    if isinstance(result, dict):
        parts = [p.get("text", "") for p in result.get("content") or [] if isinstance(p, dict)]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts), bool(result.get("is_error"))
        if "data" in result:
            result = result["data"]
    return (result if isinstance(result, str) else json.dumps(result, default=str)), False


def chat_tools(tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """MCP tools (a ``list_tools`` observation's ``tools``) as OpenAI chat tools.

    >>> chat_tools([{"name": "lookup", "input_schema": {"type": "object"}}])[0]["function"]["name"]
    'lookup'
    """
    out = []
    for tool in tools:
        params = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
        spec = {"name": tool["name"], "description": tool.get("description") or "", "parameters": params}
        out.append({"type": "function", "function": spec})
    return out
