"""The Anthropic Messages API, converted: ``system``, ``messages`` (text, ``tool_use``, ``tool_result``
blocks) and tools to chat messages and function tools, and a served chat reply back to a ``message``
object, its SSE events and Anthropic's error body.

Pure functions (no server): :mod:`.routes.messages` runs the converted request through the same
engine path as ``/v1/chat/completions``.
"""

from __future__ import annotations

import json
import logging
import secrets
from typing import Any

from .chat_format import ChatFormatError
from .chat_request import ChatRequest
from .params import parse_params

__all__ = [
    "convert_messages",
    "convert_request",
    "convert_tool_choice",
    "convert_tools",
    "error_body",
    "message_object",
    "stream_events",
]

logger = logging.getLogger(__name__)

#: Anthropic's error ``type`` by HTTP status
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
    500: "api_error",
    502: "api_error",
    529: "overloaded_error",
}

#: chat ``finish_reason`` -> Anthropic ``stop_reason``
STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _refuse(kind: str, where: str) -> ChatFormatError:
    return ChatFormatError(
        f"{where}: content blocks of type {kind!r} are not supported by this server (text, tool_use and "
        "tool_result only; the policy model reads text)",
        where,
    )


def _text_of(content: Any, where: str) -> str:
    """The text of a string or a list of ``text`` blocks; thinking blocks are skipped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatFormatError(f"{where}: content must be a string or a list of blocks", where)
    texts = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise _refuse(str(kind), where)
    return "\n".join(texts)


def system_text(system: Any) -> str:
    """The ``system`` parameter (a string or a list of text blocks) as one text, blocks a line apart.

    >>> system_text([{"type": "text", "text": "A"}, {"type": "text", "text": "B", "cache_control": {}}])
    'A\\nB'
    """
    return _text_of(system, "system")


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise ChatFormatError(f"{where}: a tool_result block needs a 'tool_use_id' string", where)
    text = _text_of(block.get("content"), where)
    if block.get("is_error"):
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _user(content: Any, where: str) -> list[dict[str, Any]]:
    """A user turn: its ``tool_result`` blocks as ``tool`` messages (first, in order), then its text."""
    if not isinstance(content, list):
        return [{"role": "user", "content": _text_of(content, where)}]
    results, texts = [], []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            results.append(_tool_result(block, where))
        elif kind == "text":
            texts.append(str(block.get("text", "")))
        else:
            raise _refuse(str(kind), where)
    out = results
    if texts or not results:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: Any, where: str) -> dict[str, Any]:
    """An assistant turn: its text, its ``tool_use`` blocks as ``tool_calls`` and its ``thinking``
    blocks as ``reasoning_content`` (what chat templates keep for the turns of the current tool loop)."""
    if not isinstance(content, list):
        return {"role": "assistant", "content": _text_of(content, where)}
    texts, calls, thoughts = [], [], []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            name, call_id = block.get("name"), block.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ChatFormatError(f"{where}: a tool_use block needs 'id' and 'name' strings", where)
            args = json.dumps(block.get("input") or {}, ensure_ascii=False)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str) and block["thinking"]:
                thoughts.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue
        else:
            raise _refuse(str(kind), where)
    msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
    if thoughts:
        msg["reasoning_content"] = "\n".join(thoughts)
    if calls:
        msg["tool_calls"] = calls
    return msg


def convert_messages(system: Any, messages: Any) -> list[dict[str, Any]]:
    """Chat messages from ``system`` and Anthropic ``messages``.

    ``system`` (string or text blocks) leads; a ``system`` message later in ``messages`` (Claude
    Code's mid-conversation system) stays where it is (the route merges it into the leading system
    prompt if the chat template refuses it); ``tool_use`` blocks become ``tool_calls`` and
    ``tool_result`` blocks ``tool`` messages; an assistant turn's ``thinking`` blocks become its
    ``reasoning_content`` (``redacted_thinking`` is left out); images and documents are refused (a 400).

    >>> convert_messages("Be brief.", [
    ...     {"role": "user", "content": "ls?"},
    ...     {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
    ...     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.txt"}]}])
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'ls?'},
     {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 't1', 'type': 'function',
       'function': {'name': 'ls', 'arguments': '{}'}}]},
     {'role': 'tool', 'tool_call_id': 't1', 'content': 'a.txt'}]
    """
    out: list[dict[str, Any]] = []
    text = system_text(system)
    if text:
        out.append({"role": "system", "content": text})
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("messages: must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(m, dict):
            raise ChatFormatError(f"{where}: must be an object", where)
        role = m.get("role")
        if role == "user":
            out += _user(m.get("content"), where)
        elif role == "assistant":
            out.append(_assistant(m.get("content"), where))
        elif role == "system":
            out.append({"role": "system", "content": _text_of(m.get("content"), where)})
        else:
            raise ChatFormatError(f"{where}.role: must be 'user' or 'assistant', got {role!r}", where)
    return out


def convert_tools(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """(chat function tools, kinds left out): client tools (``{name, description, input_schema}``,
    ``type`` absent or ``custom``) are kept; Anthropic's server and versioned tools
    (``web_search_20250305``, ``bash_20250124``, ...) are left out with a logged note."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise ChatFormatError("tools: must be a list", "tools")
    out, dropped = [], []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ChatFormatError(f"tools.{i}: must be an object", "tools")
        kind = tool.get("type", "custom")
        if kind not in ("custom", None):
            dropped.append(str(kind))
            continue
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise ChatFormatError(f"tools.{i}.name: must be a non-empty string", "tools")
        fn: dict[str, Any] = {"name": name}
        if tool.get("description"):
            fn["description"] = tool["description"]
        fn["parameters"] = tool.get("input_schema") or {"type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    if dropped:
        logger.info("Messages API: server tools left out of the prompt: %s", ", ".join(dropped))
    return out, dropped


def convert_tool_choice(choice: Any) -> tuple[Any, bool]:
    """(chat ``tool_choice``, parallel tool calls allowed) from Anthropic's ``tool_choice``."""
    if choice is None:
        return None, True
    if not isinstance(choice, dict):
        raise ChatFormatError("tool_choice: must be an object", "tool_choice")
    parallel = not choice.get("disable_parallel_tool_use", False)
    kind = choice.get("type")
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool":
        return {"type": "function", "function": {"name": choice.get("name")}}, parallel
    raise ChatFormatError(
        f"tool_choice.type: must be 'auto', 'any', 'tool' or 'none', got {kind!r}", "tool_choice"
    )


def convert_request(body: dict[str, Any]) -> ChatRequest:
    """The chat form of a Messages request body (``system``, ``messages``, ``tools``, ``tool_choice``,
    the sampling settings); a 400 for bad sampling settings, a :class:`~.chat_format.ChatFormatError`
    for what cannot be converted.

    >>> req = convert_request({"max_tokens": 5, "messages": [{"role": "user", "content": "Hi"}]})
    >>> req.api, req.messages, req.params.max_tokens
    ('messages', [{'role': 'user', 'content': 'Hi'}], 5)
    """
    t = body.get("temperature")
    if isinstance(t, (int, float)) and not isinstance(t, bool) and not 0.0 <= t <= 1.0:
        raise ChatFormatError(f"temperature: must be between 0 and 1, got {t!r}", "temperature")
    params = parse_params(sampling_body(body), chat=True, max_n=1)
    messages = convert_messages(body.get("system"), body.get("messages"))
    tools, dropped = convert_tools(body.get("tools"))
    choice, parallel = convert_tool_choice(body.get("tool_choice"))
    return ChatRequest(
        messages=messages,
        params=params,
        request_id=new_id("msg"),
        api="messages",
        tools=tools or None,
        tool_choice=choice if tools else None,
        parallel_tool_calls=parallel,
        merge_system=True,
        dropped_tools=dropped,
    )


def sampling_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-parameter view of a Messages body (``stop_sequences`` is ``stop``; Anthropic's
    ``temperature`` runs from 0 to 1)."""
    out: dict[str, Any] = {
        k: body[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stream") if k in body
    }
    if body.get("stop_sequences") is not None:
        out["stop"] = body["stop_sequences"]
    return out


def new_id(prefix: str) -> str:
    """An id in Anthropic's style: ``prefix`` + ``_`` + 24 random characters."""
    return f"{prefix}_{secrets.token_hex(12)}"


def content_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A served assistant message (chat shape) as Anthropic content blocks: thinking (its
    ``reasoning_content``, when the reply parser found reasoning), text, then tool uses."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        try:
            args = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            args = {}
        blocks.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args})
    return blocks


def message_object(
    message_id: str,
    model: str,
    message: dict[str, Any],
    finish_reason: str | None,
    stop_reason: Any,
    input_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """The ``message`` object: content blocks, ``stop_reason`` (``end_turn``, ``tool_use``,
    ``max_tokens`` or ``stop_sequence``, with the sequence that matched) and ``usage``."""
    reason = STOP_REASONS.get(str(finish_reason), "end_turn")
    sequence = None
    if reason == "end_turn" and isinstance(stop_reason, str):
        reason, sequence = "stop_sequence", stop_reason
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(message),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def stream_events(message: dict[str, Any], text_deltas: list[str] | None = None) -> list[dict[str, Any]]:
    """The SSE events of a finished ``message``: ``message_start`` (empty content, input usage),
    per block ``content_block_start``/``content_block_delta`` (``text_delta`` or ``input_json_delta``)
    /``content_block_stop``, then ``message_delta`` (``stop_reason``, output usage) and
    ``message_stop``. ``text_deltas``: the text split as it streams (default: whole)."""
    usage = message["usage"]
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
            )
            for delta in text_deltas or [block["text"]]:
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": delta},
                    }
                )
        elif block["type"] == "thinking":
            empty = {"type": "thinking", "thinking": "", "signature": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": empty})
            thought = {"type": "thinking_delta", "thinking": block["thinking"]}
            events.append({"type": "content_block_delta", "index": index, "delta": thought})
        else:
            events.append(
                {"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}}
            )
            partial = json.dumps(block["input"], ensure_ascii=False)
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "input_json_delta", "partial_json": partial},
                }
            )
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
            "usage": {"output_tokens": usage["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error body for an HTTP ``status``.

    >>> error_body(400, "bad")
    {'type': 'error', 'error': {'type': 'invalid_request_error', 'message': 'bad'}}
    """
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
