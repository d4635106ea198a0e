"""The OpenAI Responses API, converted: a request's ``input`` items, ``instructions`` and tools to chat
messages and function tools, and a served chat reply back to a ``response`` object and its SSE events.

Pure functions (no server): :mod:`.routes.responses` runs the converted request through the same
engine path as ``/v1/chat/completions``.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any

from .chat_format import ChatFormatError, content_text
from .chat_request import ChatRequest
from .params import parse_params

__all__ = [
    "ResponsesRequest",
    "convert_input",
    "convert_request",
    "convert_tool_choice",
    "convert_tools",
    "output_items",
    "response_object",
    "stream_events",
]

logger = logging.getLogger(__name__)

#: tool kinds a client declares that run on OpenAI's side (or need a grammar we cannot enforce
#: as such); they are left out of the prompt, with a note in the log and on the span
HOSTED_TOOLS = (
    "web_search",
    "web_search_preview",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "image_generation",
    "mcp",
    "local_shell",
    "tool_search",
)

#: the argument a ``custom`` (free-form) tool's input travels in, when it is offered as a function
CUSTOM_INPUT = "input"


@dataclass
class ResponsesRequest(ChatRequest):
    """A Responses request as the chat path takes it: a :class:`~.chat_request.ChatRequest` that also
    knows which tools are ``custom`` (free-form input, answered as ``custom_tool_call`` items)."""

    custom_tools: set[str] = field(default_factory=set)


def _item_text(content: Any, where: str) -> str:
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") in ("input_image", "input_file", "input_audio"):
                raise ChatFormatError(
                    f"{where}: content parts of type {part['type']!r} are not supported (text only)", where
                )
    return content_text(content, where)


def _output_text(output: Any, where: str) -> str:
    """A ``function_call_output``'s ``output``: a string, or a list of text parts."""
    if isinstance(output, (dict, int, float, bool)) and not isinstance(output, str):
        return json.dumps(output, ensure_ascii=False)
    return _item_text(output, where)


def _reasoning_text(item: dict[str, Any]) -> str:
    """A ``reasoning`` item's text: its ``reasoning_text`` content parts, else its summary parts."""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = [p for p in item.get(key) or [] if isinstance(p, dict) and p.get("type") == kind]
        texts = [str(p.get("text", "")) for p in parts]
        if any(texts):
            return "\n".join(texts)
    return ""


def convert_input(value: Any, instructions: Any = None) -> list[dict[str, Any]]:
    """Chat messages from ``instructions`` and ``input`` (a string or a list of items).

    Message items (``user``, ``assistant``, ``system``, ``developer``; with or without
    ``"type": "message"``) keep their role; ``function_call`` and ``custom_tool_call`` items become
    the ``tool_calls`` of an assistant message (consecutive ones, and the assistant text before
    them, in one message); ``function_call_output`` and ``custom_tool_call_output`` become ``tool``
    messages; a ``reasoning`` item's text becomes the ``reasoning_content`` of the assistant message or
    function call after it (chat templates keep it for the turns of the current tool loop).

    >>> convert_input([{"role": "developer", "content": "Be brief."},
    ...                {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"},
    ...                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}])
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'developer', 'content': 'Be brief.'},
     {'role': 'assistant', 'content': '', 'tool_calls': [{'id': 'c1', 'type': 'function',
       'function': {'name': 'ls', 'arguments': '{}'}}]},
     {'role': 'tool', 'tool_call_id': 'c1', 'content': 'a.txt'}]
    """
    out: list[dict[str, Any]] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ChatFormatError("'instructions' must be a string", "instructions")
        if instructions:
            out.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        out.append({"role": "user", "content": value})
        return out
    if not isinstance(value, list):
        raise ChatFormatError("'input' must be a string or a list of input items", "input")
    thinking: list[str] = []  # reasoning items not yet attached to an assistant message
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ChatFormatError(f"{where} must be an object", "input")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise ChatFormatError(
                    f"{where}.role must be 'user', 'assistant', 'system' or 'developer', got {role!r}",
                    "input",
                )
            out.append({"role": role, "content": _item_text(item.get("content"), "input")})
            if role == "assistant" and thinking:
                out[-1]["reasoning_content"] = "\n".join(thinking)
            thinking = [] if role in ("assistant", "user") else thinking  # attached, or followed by none
        elif kind in ("function_call", "custom_tool_call"):
            name, call_id = item.get("name"), item.get("call_id") or item.get("id")
            if not isinstance(name, str) or not isinstance(call_id, str):
                raise ChatFormatError(f"{where} ({kind}) needs 'name' and 'call_id' strings", "input")
            if kind == "function_call":
                args = item.get("arguments", "{}")
                args = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            else:
                args = json.dumps({CUSTOM_INPUT: item.get("input", "")}, ensure_ascii=False)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if not out or out[-1]["role"] != "assistant":
                out.append({"role": "assistant", "content": ""})
            last = out[-1]
            last.setdefault("tool_calls", []).append(call)
            if thinking:
                joined = filter(None, [last.get("reasoning_content"), *thinking])
                last["reasoning_content"], thinking = "\n".join(joined), []
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ChatFormatError(f"{where} ({kind}) needs a 'call_id' string", "input")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _output_text(item.get("output"), "input"),
                }
            )
        elif kind == "reasoning":
            thinking += filter(None, [_reasoning_text(item)])
        elif kind == "item_reference":
            raise ChatFormatError(
                f"{where}: 'item_reference' items are not supported; send the items themselves", "input"
            )
        else:
            raise ChatFormatError(f"{where}: input items of type {kind!r} are not supported", "input")
    return out


def _function_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"{where}.name must be a non-empty string", "tools")
    fn: dict[str, Any] = {"name": name}
    if tool.get("description"):
        fn["description"] = tool["description"]
    fn["parameters"] = tool.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "function", "function": fn}


def _custom_tool(tool: dict[str, Any], where: str) -> dict[str, Any]:
    """A free-form ``custom`` tool offered as a function with one string argument."""
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise ChatFormatError(f"{where}.name must be a non-empty string", "tools")
    description = str(tool.get("description") or "")
    fmt = tool.get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "grammar":
        syntax, definition = fmt.get("syntax", ""), fmt.get("definition", "")
        note = f"The '{CUSTOM_INPUT}' must follow this {syntax} grammar:\n{definition}"
        description = f"{description}\n\n{note}" if description else note
    fn = {
        "name": name,
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string"}},
            "required": [CUSTOM_INPUT],
        },
    }
    return {"type": "function", "function": fn}


def convert_tools(tools: Any) -> tuple[list[dict[str, Any]], set[str], list[str]]:
    """(chat function tools, names of the ``custom`` tools among them, kinds left out).

    ``function`` tools are kept; ``namespace`` tools are flattened into their functions; ``custom``
    tools become functions with one string argument ``input``; hosted tools (web search, file
    search, tool search, ...) are left out, each named in the third list.

    >>> tools, custom, dropped = convert_tools([
    ...     {"type": "function", "name": "ls", "parameters": {"type": "object"}},
    ...     {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "spawn"}]},
    ...     {"type": "custom", "name": "apply_patch"}, {"type": "web_search"}])
    >>> [t["function"]["name"] for t in tools], custom, dropped
    (['ls', 'spawn', 'apply_patch'], {'apply_patch'}, ['web_search'])
    """
    if tools is None:
        return [], set(), []
    if not isinstance(tools, list):
        raise ChatFormatError("'tools' must be a list", "tools")
    out: list[dict[str, Any]] = []
    custom: set[str] = set()
    dropped: list[str] = []

    def add(tool: Any, where: str) -> None:
        if not isinstance(tool, dict):
            raise ChatFormatError(f"{where} must be an object", "tools")
        kind = tool.get("type", "function")
        if kind == "function":
            out.append(_function_tool(tool, where))
        elif kind == "namespace":
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise ChatFormatError(f"{where}.tools must be a list", "tools")
            for j, t in enumerate(inner):
                add(t, f"{where}.tools[{j}]")
        elif kind == "custom":
            out.append(_custom_tool(tool, where))
            custom.add(tool["name"])
        elif isinstance(kind, str) and (kind in HOSTED_TOOLS or kind.startswith("web_search")):
            dropped.append(kind)
        else:
            raise ChatFormatError(f"{where}: tools of type {kind!r} are not supported", "tools")

    for i, tool in enumerate(tools):
        add(tool, f"tools[{i}]")
    if dropped:
        logger.info("Responses API: hosted tools left out of the prompt: %s", ", ".join(dropped))
    return out, custom, dropped


def convert_tool_choice(choice: Any) -> Any:
    """A Responses ``tool_choice`` in chat form (``{"type": "function", "name": ...}`` gains its
    ``function`` wrapper; a hosted tool's choice becomes ``auto``)."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("function", "custom"):
            return {"type": "function", "function": {"name": choice.get("name")}}
        if kind == "allowed_tools":
            return "required" if choice.get("mode") == "required" else "auto"
        return "auto"
    raise ChatFormatError(f"invalid tool_choice {choice!r}", "tool_choice")


def convert_format(text: Any) -> Any:
    """``text.format`` as a chat ``response_format`` (``None`` for plain text)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise ChatFormatError("'text' must be an object", "text")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return None
    if not isinstance(fmt, dict):
        raise ChatFormatError("'text.format' must be an object", "text.format")
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    return fmt  # json_object, or a type the chat path names in its 400


def sampling_body(body: dict[str, Any]) -> dict[str, Any]:
    """The chat-parameter view of a Responses body (``max_output_tokens`` is ``max_tokens``)."""
    out: dict[str, Any] = {
        k: body[k] for k in ("temperature", "top_p", "top_logprobs", "stream") if k in body
    }
    if body.get("max_output_tokens") is not None:
        out["max_tokens"] = body["max_output_tokens"]
    if body.get("top_logprobs"):
        out["logprobs"] = True
    return out


def convert_request(body: dict[str, Any], history: list[dict[str, Any]] | None = None) -> ResponsesRequest:
    """The chat form of a Responses request body (``history``: the messages of the response that
    ``previous_response_id`` names, put before the new input); a 400 for bad sampling settings, a
    :class:`~.chat_format.ChatFormatError` for what cannot be converted.

    >>> req = convert_request({"input": "Hi", "instructions": "Be brief.", "max_output_tokens": 9})
    >>> req.api, req.messages, req.params.max_tokens, req.merge_system
    ('responses', [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi'}], 9, True)
    """
    if body.get("n") not in (None, 1):
        raise ChatFormatError("'n' is not supported by the Responses API", "n")
    params = parse_params(sampling_body(body), chat=True, max_n=1)
    messages = convert_input(body.get("input", []), body.get("instructions"))
    if history:
        system = [m for m in messages[:1] if body.get("instructions") and m["role"] == "system"]
        messages = system + list(history) + messages[len(system) :]
    if not messages:
        raise ChatFormatError("'input' must not be empty", "input")
    tools, custom, dropped = convert_tools(body.get("tools"))
    choice = convert_tool_choice(body.get("tool_choice"))
    return ResponsesRequest(
        messages=messages,
        params=params,
        request_id=new_id("resp"),
        api="responses",
        tools=tools or None,
        tool_choice=choice if tools else None,
        response_format=convert_format(body.get("text")),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
        merge_system=True,
        dropped_tools=dropped,
        custom_tools=custom,
    )


def new_id(prefix: str) -> str:
    """An id in OpenAI's style: ``prefix`` + ``_`` + 48 hex characters."""
    return f"{prefix}_{secrets.token_hex(24)}"


def output_items(message: dict[str, Any], custom_tools: set[str] = frozenset()) -> list[dict[str, Any]]:  # type: ignore[assignment]
    """A served assistant message (chat shape) as Responses output items: a ``reasoning`` item with its
    ``reasoning_content`` (when the reply parser found reasoning), a ``message`` with its text, then
    one ``function_call`` (or ``custom_tool_call``) per tool call."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        items.append(
            {
                "id": new_id("rs"),
                "type": "reasoning",
                "status": "completed",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": message["reasoning_content"]}],
            }
        )
    text = message.get("content")
    if text:
        items.append(
            {
                "id": new_id("msg"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        )
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        if fn["name"] in custom_tools:
            try:
                raw = json.loads(fn["arguments"]).get(CUSTOM_INPUT, "")
            except (json.JSONDecodeError, AttributeError):
                raw = fn["arguments"]
            items.append(
                {
                    "id": new_id("ctc"),
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": call["id"],
                    "name": fn["name"],
                    "input": raw if isinstance(raw, str) else json.dumps(raw, ensure_ascii=False),
                }
            )
        else:
            items.append(
                {
                    "id": new_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": call["id"],
                    "name": fn["name"],
                    "arguments": fn["arguments"],
                }
            )
    return items


def usage_of(total: dict[str, int]) -> dict[str, Any]:
    """Chat ``usage`` in the Responses shape."""
    return {
        "input_tokens": total["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": total["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total["total_tokens"],
    }


def response_object(
    response_id: str,
    body: dict[str, Any],
    model: str,
    created: int,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    finish_reason: str | None,
    max_output_tokens: int | None,
    status: str = "completed",
) -> dict[str, Any]:
    """The ``response`` object: ``status`` ``incomplete`` (reason ``max_output_tokens``) when the
    reply ran out of tokens."""
    incomplete = status == "completed" and finish_reason == "length"
    text = body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}}
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": max_output_tokens,
        "model": model,
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": body.get("store", True) is not False,
        "temperature": body.get("temperature", 1.0),
        "text": text,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    """An output item as announced by ``response.output_item.added``: empty, in progress."""
    if item["type"] in ("message", "reasoning"):
        return {**item, "status": "in_progress", "content": []}
    if item["type"] == "function_call":
        return {**item, "status": "in_progress", "arguments": ""}
    return {**item, "status": "in_progress", "input": ""}


def stream_events(response: dict[str, Any], text_deltas: list[str] | None = None) -> list[dict[str, Any]]:
    """The SSE events of a finished ``response``, in order: ``response.created``,
    ``response.in_progress``, per output item ``output_item.added``, its content events (text parts
    and deltas, or function-call argument deltas) and ``output_item.done``, then
    ``response.completed`` (``response.incomplete`` when it ran out of tokens). Each event has its
    ``sequence_number``. ``text_deltas``: the message text split as it streams (default: whole)."""
    events: list[dict[str, Any]] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events), **fields})

    start = {**response, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    emit("response.created", response=start)
    emit("response.in_progress", response=start)
    for index, item in enumerate(response["output"]):
        emit("response.output_item.added", output_index=index, item=_in_progress(item))
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            part = item["content"][0]
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            emit("response.content_part.added", **ids, content_index=0, part=empty)
            for delta in text_deltas or [part["text"]]:
                emit("response.output_text.delta", **ids, content_index=0, delta=delta, logprobs=[])
            emit("response.output_text.done", **ids, content_index=0, text=part["text"], logprobs=[])
            emit("response.content_part.done", **ids, content_index=0, part=part)
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            emit("response.reasoning_text.delta", **ids, content_index=0, delta=text)
            emit("response.reasoning_text.done", **ids, content_index=0, text=text)
        elif item["type"] == "function_call":
            emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            emit(
                "response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"]
            )
        else:
            emit("response.custom_tool_call_input.delta", **ids, delta=item["input"])
            emit("response.custom_tool_call_input.done", **ids, input=item["input"])
        emit("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    emit(final, response=response)
    return events
