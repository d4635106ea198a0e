"""Chat prompts for the policy model: chat-template rendering and tools in the prompt.

Models whose chat template knows tools get them through the template; for the others (SmolLM2)
the tools are described in a system message and the model is asked to answer with
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, which the ``hermes`` parser of
:mod:`.parsers` reads back into OpenAI ``tool_calls``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

from ..errors import InvalidRequestError
from .parsers.detect import template_renders_tools
from .parsers.hermes import read_hermes

__all__ = [
    "ChatFormatError",
    "TOOLS_PROMPT",
    "chat_template_text",
    "content_text",
    "format_tool_calls",
    "new_tool_call_id",
    "parse_tool_calls",
    "prepare_messages",
    "render_chat",
    "select_tools",
    "template_renders_tools",
    "template_supports_tools",
    "tools_system_prompt",
]

#: The system-prompt block that offers tools to a model whose chat template has no tool support.
TOOLS_PROMPT = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_ROLES = ("system", "user", "assistant", "tool", "developer", "function")


class ChatFormatError(InvalidRequestError):
    """A request's messages or tools cannot be rendered (the server answers 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def new_tool_call_id() -> str:
    """A fresh OpenAI-style tool call id (``call_`` + 24 hex characters)."""
    return "call_" + secrets.token_hex(12)


def content_text(content: Any, where: str = "messages") -> str:
    """The text of a message's ``content``: a string, ``None`` or a list of ``{"type": "text"}`` parts.

    >>> content_text([{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}])
    'Hello there'
    >>> content_text(None)
    ''
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text"):
                parts.append(str(part.get("text", "")))
            elif isinstance(part, dict) and part.get("type") == "refusal":
                parts.append(str(part.get("refusal", "")))
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise ChatFormatError(f"content parts of type {kind!r} are not supported (text only)", where)
        return "".join(parts)
    raise ChatFormatError(f"message content must be a string or a list of parts, got {content!r}", where)


def _function(tool: Any, i: int) -> dict[str, Any]:
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise ChatFormatError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}", "tools")
    fn = tool.get("function")
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise ChatFormatError(f"tools[{i}].function.name must be a non-empty string", "tools")
    return fn


def select_tools(
    tools: Sequence[Any] | None, tool_choice: Any = None
) -> tuple[list[dict[str, Any]], str | None]:
    """The tools to offer under ``tool_choice`` and an extra instruction (or ``None``).

    ``"none"`` offers none; ``"required"`` asks for at least one call; a named choice
    (``{"type": "function", "function": {"name": ...}}``) offers only that tool and requires it.

    >>> tools = [{"type": "function", "function": {"name": "calc"}}]
    >>> select_tools(tools, "none")
    ([], None)
    >>> select_tools(tools, {"type": "function", "function": {"name": "calc"}})[1]
    'You must call the function "calc".'
    """
    if tools is None:
        tools = []
    if not isinstance(tools, list):
        raise ChatFormatError("tools must be a list", "tools")
    fns = [_function(t, i) for i, t in enumerate(tools)]
    full: list[dict[str, Any]] = [{"type": "function", "function": fn} for fn in fns]
    if tool_choice is None or tool_choice == "auto":
        return full, None
    if tool_choice == "none":
        return [], None
    if tool_choice == "required":
        if not full:
            raise ChatFormatError("tool_choice 'required' needs tools", "tool_choice")
        return full, "You must call at least one of the functions."
    if isinstance(tool_choice, dict):
        name = (
            (tool_choice.get("function") or {}).get("name") if tool_choice.get("type") == "function" else None
        )
        if not isinstance(name, str):
            raise ChatFormatError(
                "tool_choice must be 'none', 'auto', 'required' or "
                "{'type': 'function', 'function': {'name': ...}}",
                "tool_choice",
            )
        chosen = [t for t in full if t["function"]["name"] == name]
        if not chosen:
            raise ChatFormatError(
                f"tool_choice names the function {name!r}, which is not in tools", "tool_choice"
            )
        return chosen, f'You must call the function "{name}".'
    raise ChatFormatError(f"invalid tool_choice {tool_choice!r}", "tool_choice")


def tools_system_prompt(tools: Sequence[dict[str, Any]], instruction: str | None = None) -> str:
    """The system-prompt text that describes ``tools`` to a model without native tool support.

    >>> print(tools_system_prompt([{"type": "function", "function": {"name": "calc"}}]).splitlines()[6])
    {"type": "function", "function": {"name": "calc"}}
    """
    text = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
    return text if not instruction else f"{text}\n\n{instruction}"


def _call_parts(call: Any) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI tool call or a plain ``{"name", "arguments"}`` dict."""
    if not isinstance(call, dict):
        raise ChatFormatError(f"a tool call must be an object, got {call!r}", "messages")
    f = call.get("function")
    fn = f if isinstance(f, dict) else call
    name = fn.get("name")
    if not isinstance(name, str):
        raise ChatFormatError(f"a tool call needs a function name, got {call!r}", "messages")
    args = fn.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # keep the model's text as it was
    return name, args


def format_tool_calls(calls: Sequence[Any]) -> str:
    """Tool calls as the ``<tool_call>`` text a model without native tool support is asked to write.

    Accepts OpenAI ``tool_calls`` entries or plain ``{"name": ..., "arguments": {...}}`` dicts.

    >>> print(format_tool_calls([{"name": "calc", "arguments": {"expr": "2+2"}}]))
    <tool_call>
    {"name": "calc", "arguments": {"expr": "2+2"}}
    </tool_call>
    """
    blocks = []
    for call in calls:
        name, args = _call_parts(call)
        body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{body}\n</tool_call>")
    return "\n".join(blocks)


def chat_template_text(tokenizer: Any) -> str | None:
    """The tokenizer's chat template text (several named templates joined), ``None`` when it has none.

    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> chat_template_text(ByteTokenizer())
    'chatml (built in; no tools)'
    """
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(v) for v in template.values())
    return template if isinstance(template, str) else None


def template_supports_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template renders a ``tools`` argument itself
    (:func:`template_renders_tools` of its template)."""
    return template_renders_tools(chat_template_text(tokenizer))


def _reasoning_of(message: dict[str, Any], where: str) -> str | None:
    """An assistant message's thinking: ``reasoning_content`` (vLLM's answer field, what the OpenAI
    client keeps when the returned message is appended), else ``reasoning`` (newer vLLM's name)."""
    for key in ("reasoning_content", "reasoning"):
        value = message.get(key)
        if value is None:
            continue
        if not isinstance(value, str):
            raise ChatFormatError(f"{where}.{key} must be a string, got {type(value).__name__}", where)
        return value
    return None


def prepare_messages(
    messages: Any,
    tools: Sequence[dict[str, Any]] | None = None,
    instruction: str | None = None,
    native_tools: bool = False,
) -> list[dict[str, Any]]:
    """Validate OpenAI chat messages and turn them into what a chat template can render.

    Content parts become text; ``developer`` becomes ``system``. An assistant message's thinking
    (``reasoning_content``, or ``reasoning`` as newer vLLM clients send it) is kept as
    ``reasoning_content`` (and ``reasoning``): templates that keep the thinking of the turns after the
    last user message (Qwen3, GLM) read it. Without native tool support,
    the tools go into the (first) system message, the assistant's earlier tool calls become
    ``<tool_call>`` text and tool results become user turns in ``<tool_response>`` tags.

    >>> msgs = [{"role": "user", "content": "2+2?"},
    ...         {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
    ...          "function": {"name": "calc", "arguments": "{\\"expr\\": \\"2+2\\"}"}}]},
    ...         {"role": "tool", "tool_call_id": "c1", "content": "4"}]
    >>> [m["role"] for m in prepare_messages(msgs)]
    ['user', 'assistant', 'user']
    >>> prepare_messages(msgs)[2]["content"]
    '<tool_response>\\n4\\n</tool_response>'
    """
    if not isinstance(messages, list) or not messages:
        raise ChatFormatError("messages must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise ChatFormatError(f"{where} must be an object", where)
        role = m.get("role")
        if role not in _ROLES:
            raise ChatFormatError(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", where)
        text = content_text(m.get("content"), where)
        if role == "developer":
            role = "system"
        calls = m.get("tool_calls") or []
        thought = _reasoning_of(m, where) if role == "assistant" else None
        kept = {"reasoning_content": thought, "reasoning": thought} if thought is not None else {}
        if role == "assistant" and calls:
            if not isinstance(calls, list):
                raise ChatFormatError(f"{where}.tool_calls must be a list", where)
            if native_tools:
                native = []
                for c in calls:
                    name, args = _call_parts(c)
                    native.append(
                        {
                            "id": c.get("id") if isinstance(c, dict) else None,
                            "type": "function",
                            "function": {"name": name, "arguments": args},
                        }
                    )
                out.append({"role": "assistant", "content": text, "tool_calls": native, **kept})
            else:
                rendered = format_tool_calls(calls)
                joined = f"{text}\n{rendered}" if text else rendered
                out.append({"role": "assistant", "content": joined, **kept})
            continue
        if role in ("tool", "function"):
            if native_tools:
                msg = {"role": "tool", "content": text}
                if m.get("tool_call_id"):
                    msg["tool_call_id"] = m["tool_call_id"]
                if m.get("name"):
                    msg["name"] = m["name"]
                out.append(msg)
            else:
                out.append({"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"})
            continue
        msg = {"role": role, "content": text, **kept}
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        out.append(msg)
    if tools and not native_tools:
        block = tools_system_prompt(tools, instruction)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{block}" if out[0]["content"] else block}
        else:
            out.insert(0, {"role": "system", "content": block})
    elif instruction and native_tools:
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instruction}"}
        else:
            out.insert(0, {"role": "system", "content": instruction})
    return out


def render_chat(
    tokenizer: Any,
    messages: Any,
    tools: Sequence[Any] | None = None,
    tool_choice: Any = None,
    **template_kwargs: Any,
) -> str:
    """The prompt text for ``messages`` (and ``tools``), ending with the assistant turn's header;
    ``template_kwargs``: extra variables of the chat template (``enable_thinking=False``...; they
    cannot change ``tokenize``, ``add_generation_prompt`` or ``tools``).

    >>> from agentlightning_lite.serving.tokenizer import ByteTokenizer
    >>> print(render_chat(ByteTokenizer(), [{"role": "user", "content": "Hi"}]))
    <|im_start|>user
    Hi<|im_end|>
    <|im_start|>assistant
    <BLANKLINE>
    """
    offered, instruction = select_tools(tools, tool_choice)
    native = template_supports_tools(tokenizer)
    prepared = _thinking_as_template_reads_it(
        prepare_messages(messages, offered, instruction, native_tools=native), chat_template_text(tokenizer)
    )
    reserved = ("tokenize", "add_generation_prompt", "tools", "conversation", "messages")
    kwargs: dict[str, Any] = {k: v for k, v in template_kwargs.items() if k not in reserved}
    kwargs |= {"tokenize": False, "add_generation_prompt": True}
    if native and offered:
        kwargs["tools"] = offered
    try:
        text = tokenizer.apply_chat_template(prepared, **kwargs)
    except ChatFormatError:
        raise
    except Exception as exc:  # jinja errors: the template rejects these messages
        raise ChatFormatError(
            f"the model's chat template cannot render these messages: {exc}", "messages"
        ) from exc
    if not isinstance(text, str):
        raise ChatFormatError("the chat template did not return text", "messages")
    return text


def _thinking_as_template_reads_it(
    messages: list[dict[str, Any]], template: str | None
) -> list[dict[str, Any]]:
    """Assistant thinking (``reasoning_content``) also where a template reads it otherwise: gpt-oss's
    ``message.thinking``, Ministral's ``thinking`` content chunk before the text."""
    if not template or "reasoning_content" in template:
        return messages
    chunks = "'thinking'" in template and "block['thinking']" in template
    thinking_field = "message.thinking" in template
    if not (chunks or thinking_field):
        return messages
    out = []
    for m in messages:
        thought = m.get("reasoning_content") if m.get("role") == "assistant" else None
        if thought is None or (thinking_field and m.get("tool_calls") and m.get("content")):
            out.append(m)  # gpt-oss refuses both content and thinking beside tool calls: the content stays
        elif thinking_field:
            out.append({**m, "thinking": thought})
        else:
            blocks = [{"type": "thinking", "thinking": thought}]
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            out.append({**m, "content": blocks})
    return out


def parse_tool_calls(
    text: str, tools: Sequence[dict[str, Any]] | None = None
) -> tuple[str | None, list[dict[str, Any]]]:
    """Split model output into (content, OpenAI ``tool_calls``), as the ``hermes`` parser reads it
    (:func:`~.parsers.hermes.read_hermes`; ``ChatFormatError`` for a malformed entry of ``tools``).

    Reads ``<tool_call>{...}</tool_call>`` blocks (an unclosed last block too) and, failing
    those, an answer that is nothing but a JSON call object (or list of them). Calls must name
    one of ``tools`` (when given) and carry object arguments; anything else stays content.

    >>> tools = [{"type": "function", "function": {"name": "calc"}}]
    >>> content, calls = parse_tool_calls('Let me compute.<tool_call>{"name": "calc", '
    ...                                   '"arguments": {"expr": "2+2"}}</tool_call>', tools)
    >>> content, calls[0]["function"]
    ('Let me compute.', {'name': 'calc', 'arguments': '{"expr": "2+2"}'})
    >>> parse_tool_calls("4", tools)
    ('4', [])
    """
    if tools is not None:
        for i, t in enumerate(tools):
            _function(t, i)
    content, calls = read_hermes(text, tools)
    return content, [
        {
            "id": new_tool_call_id(),
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)},
        }
        for name, args in calls
    ]
