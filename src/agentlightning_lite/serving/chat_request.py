"""One request shape for every chat dialect: Chat Completions, Responses and Messages requests are
each converted into a :class:`ChatRequest`, which one function serves (``routes.chat.serve_chat``).

Also here: the prompt a chat request renders to (:func:`render_prompt`, with the one fallback for
chat templates that take a system prompt only first).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Any

from .chat_format import ChatFormatError, content_text
from .engines.contract import ServingEngine
from .errors import bad_request
from .params import Params, parse_params

__all__ = ["ChatRequest", "chat_request", "has_late_system", "merge_system_messages", "render_prompt"]


@dataclass
class ChatRequest:
    """A chat request as the server serves it, whatever dialect it came in.

    ``messages``: OpenAI chat messages; ``tools``/``tool_choice``: OpenAI function tools and choice;
    ``params``: the sampling settings; ``api``: the dialect (``chat.completions``, ``responses``,
    ``messages``: it names the span and decides whether ``max_tokens`` is clamped); ``request_id``:
    the id the answer carries. ``parallel_tool_calls=False`` keeps only a reply's first tool call.
    ``merge_system``: when the chat template refuses a system message after the first turn, such
    messages are merged into the leading one (the converted dialects, whose clients put them there).
    ``dropped_tools``: tools the client declared that the model is not offered (recorded on the span).
    ``chat_template_kwargs``: extra variables of the chat template (vLLM's request field, e.g.
    ``{"enable_thinking": False}`` for Qwen3), passed to the tokenizer's ``apply_chat_template``.

    >>> req = chat_request({"messages": [{"role": "user", "content": "Hi"}], "n": 2}, max_n=4)
    >>> req.api, req.params.n, req.request_id.startswith("chatcmpl-")
    ('chat.completions', 2, True)
    """

    messages: Any
    params: Params
    request_id: str
    api: str = "chat.completions"
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    response_format: Any = None
    parallel_tool_calls: bool = True
    merge_system: bool = False
    dropped_tools: list[str] = field(default_factory=list)
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


def chat_request(body: dict[str, Any], max_n: int) -> ChatRequest:
    """The :class:`ChatRequest` of a ``/v1/chat/completions`` body; a 400 naming what is wrong."""
    params = parse_params(body, chat=True, max_n=max_n)
    if body.get("messages") is None:
        raise bad_request(
            "Missing required parameter: 'messages'.", "messages", code="missing_required_parameter"
        )
    template_kwargs = body.get("chat_template_kwargs")
    if template_kwargs is not None and not isinstance(template_kwargs, dict):
        raise bad_request(
            f"'chat_template_kwargs' must be an object, got {type(template_kwargs).__name__}.",
            "chat_template_kwargs",
        )
    return ChatRequest(
        chat_template_kwargs=dict(template_kwargs or {}),
        messages=body["messages"],
        params=params,
        request_id="chatcmpl-" + secrets.token_hex(12),
        tools=body.get("tools"),
        tool_choice=body.get("tool_choice"),
        response_format=body.get("response_format"),
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )


def render_prompt(engine: ServingEngine, req: ChatRequest) -> tuple[str, Any, bool]:
    """The prompt text of ``req`` in the engine's chat template: ``(text, messages, merged)``, where
    ``messages`` are those rendered and ``merged`` says whether late system messages were merged into
    the first (only when the template refuses them and ``req.merge_system``); the template is given
    ``req.chat_template_kwargs``. Raises :class:`~.chat_format.ChatFormatError` when the template
    cannot render the request."""
    extra = req.chat_template_kwargs
    try:
        return (
            engine.apply_chat_template(req.messages, req.tools, req.tool_choice, **extra),
            req.messages,
            False,
        )
    except ChatFormatError:
        if not req.merge_system or not has_late_system(req.messages):
            raise
    merged = merge_system_messages(req.messages)
    return engine.apply_chat_template(merged, req.tools, req.tool_choice, **extra), merged, True


def has_late_system(messages: Any) -> bool:
    """Whether a ``system``/``developer`` message follows a message of another role.

    >>> has_late_system([{"role": "user", "content": "q"}, {"role": "system", "content": "B"}])
    True
    """
    if not isinstance(messages, list):
        return False
    seen_other = False
    for m in messages:
        role = m.get("role") if isinstance(m, dict) else None
        if role in ("system", "developer"):
            if seen_other:
                return True
        else:
            seen_other = True
    return False


def merge_system_messages(messages: list[Any]) -> list[Any]:
    """The messages with every ``system``/``developer`` message merged into one leading system
    message (their texts in order, a blank line apart): for chat templates that take a system
    prompt only first.

    >>> merge_system_messages([{"role": "system", "content": "A"}, {"role": "user", "content": "q"},
    ...                        {"role": "system", "content": "B"}])
    [{'role': 'system', 'content': 'A\\n\\nB'}, {'role': 'user', 'content': 'q'}]
    """
    system = [m for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
    rest = [m for m in messages if not (isinstance(m, dict) and m.get("role") in ("system", "developer"))]
    texts = [content_text(m.get("content"), "messages") for m in system]
    return [{"role": "system", "content": "\n\n".join(t for t in texts if t)}, *rest]
