"""AutoGen AgentChat (0.7) adapter: a model-client wrapper, an event-log handler, and agent turn spans.

``LightningModelClient(client)`` records each model call with exact timing; ``LightningEventHandler``
turns AutoGen's event logs (LLM calls, tool call requests and results) into spans; :func:`instrument`
installs the handler and records each agent turn (direct runs and team turns) as an ``agent`` span.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

from autogen_agentchat import EVENT_LOGGER_NAME as AGENTCHAT_LOGGER
from autogen_agentchat.agents import BaseChatAgent
from autogen_agentchat.messages import ToolCallExecutionEvent, ToolCallRequestEvent
from autogen_agentchat.teams import BaseGroupChat
from autogen_agentchat.teams._group_chat._chat_agent_container import ChatAgentContainer
from autogen_core import EVENT_LOGGER_NAME as CORE_LOGGER
from autogen_core.logging import LLMCallEvent
from autogen_core.models import ChatCompletionClient, CreateResult, LLMMessage

from .._json import json_or_text
from ..store.base import Store
from ..tracer import Tracer
from ._autogen_hooks import (
    current_key,
    handler_recorder,
    hooks_lock,
    own_key,
    patch_method,
    tap_logger,
    wrap_coroutine,
    wrap_stream,
)
from ._common import Installed, Instrumentation, Recorder, message_dict

__all__ = [
    "LightningEventHandler",
    "LightningModelClient",
    "instrument",
    "uninstrument",
]

#: the key of the LightningModelClient call open in this context (the event handler adds its response id)
_active_llm: contextvars.ContextVar[tuple[Recorder, Any] | None] = contextvars.ContextVar(
    "agl_autogen_llm", default=None
)


def _agent_of(agent_id: Any) -> str | None:
    """The participant name in an AgentChat team's agent id (``<name>_<team id>/<key>``)."""
    if not isinstance(agent_id, str) or not agent_id:
        return None
    kind = agent_id.split("/", 1)[0]
    return kind.rsplit("_", 1)[0] if "_" in kind else kind


def _own_caller(recorder: Recorder, parent: Any) -> bool:
    """Whether an LLM call is named after the AutoGen agent making it rather than its enclosing span.

    True outside any recorded span, and directly under a team run (a ``chain`` span): a call there
    is made by the team's manager, not in a participant's turn (``SelectorGroupChat``'s speaker
    selection, made by its ``SelectorGroupChatManager``).
    """
    if parent is None:
        return True
    handle = recorder.get(parent)
    return handle is not None and handle.kind == "chain"


def _content(content: Any) -> Any:
    if isinstance(content, str) or content is None:
        return content
    if isinstance(content, list):
        return [c if isinstance(c, str) else {"type": type(c).__name__} for c in content]
    return str(content)


def _message(m: Any) -> dict[str, Any]:
    """An AutoGen ``LLMMessage`` as an OpenAI chat message."""
    kind = type(m).__name__
    if kind == "SystemMessage":
        return {"role": "system", "content": m.content}
    if kind == "UserMessage":
        return {"role": "user", "content": _content(m.content), "name": m.source}
    if kind == "AssistantMessage":
        if isinstance(m.content, list):
            calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in m.content]
            return message_dict("assistant", m.thought, calls)
        return {"role": "assistant", "content": m.content}
    if kind == "FunctionExecutionResultMessage":
        return {
            "role": "tool",
            "content": [
                {"tool_call_id": r.call_id, "content": r.content, "is_error": r.is_error} for r in m.content
            ],
        }
    return {"role": "unknown", "content": str(m)}


def _result(result: CreateResult) -> dict[str, Any]:
    if isinstance(result.content, list):
        calls = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in result.content]
        return message_dict("assistant", result.thought, calls)
    return {"role": "assistant", "content": result.content}


class LightningModelClient(ChatCompletionClient):
    """Wrap any AutoGen ``ChatCompletionClient`` so each call is an ``llm`` span (exact start and end).

    The agent name is ``agent`` if given, else the agent whose turn is being recorded
    (:func:`instrument`), else the team participant making the call.

    >>> from autogen_ext.models.openai import OpenAIChatCompletionClient  # doctest: +SKIP
    >>> client = LightningModelClient(OpenAIChatCompletionClient(model=llm.model, base_url=llm.base_url,
    ...                               api_key=llm.api_key, model_info=info))  # doctest: +SKIP
    >>> agent = AssistantAgent("writer", model_client=client)  # doctest: +SKIP
    """

    component_type = "model"

    def __init__(
        self,
        client: ChatCompletionClient,
        agent: str | None = None,
        tracer: Tracer | Store | None = None,
        join: bool = True,
    ) -> None:
        self.inner = client
        self.agent = agent
        self.recorder = Recorder("autogen", tracer, join=join)

    def _open(self, messages: Sequence[LLMMessage], tools: Sequence[Any]) -> object:
        key = object()
        parent = current_key.get()
        recorder = handler_recorder(parent) or self.recorder
        name = self.agent
        if name is None and _own_caller(recorder, parent):
            try:
                from autogen_core import MessageHandlerContext

                name = _agent_of(str(MessageHandlerContext.agent_id()))
            except (RuntimeError, ImportError):
                name = None
        model = (getattr(self.inner, "_create_args", None) or {}).get("model")
        attrs = {"tools": [getattr(t, "name", None) or t.get("name") for t in tools]} if tools else None
        recorder.start(
            key,
            "llm",
            "create",
            parent_key=parent,
            agent=name,
            input=[_message(m) for m in messages],
            attributes=attrs,
            model=model,
        )
        return key

    def _recorder_for(self, key: object) -> Recorder:
        parent_rec = handler_recorder(current_key.get())
        return parent_rec if parent_rec is not None and parent_rec.get(key) is not None else self.recorder

    async def create(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Any] = [],
        tool_choice: Any = "auto",
        json_output: Any = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Any = None,
    ) -> CreateResult:
        """Call the wrapped client inside an ``llm`` span."""
        key = self._open(messages, tools)
        rec = self._recorder_for(key)
        token = _active_llm.set((rec, key))
        try:
            result = await self.inner.create(
                messages,
                tools=tools,
                tool_choice=tool_choice,
                json_output=json_output,
                extra_create_args=extra_create_args,
                cancellation_token=cancellation_token,
            )
        except BaseException as exc:
            rec.end(key, error=exc)
            raise
        finally:
            _active_llm.reset(token)
        rec.end(key, output=_result(result), attributes={"finish_reason": result.finish_reason})
        return result

    async def create_stream(
        self,
        messages: Sequence[LLMMessage],
        *,
        tools: Sequence[Any] = [],
        tool_choice: Any = "auto",
        json_output: Any = None,
        extra_create_args: Mapping[str, Any] = {},
        cancellation_token: Any = None,
        **kwargs: Any,
    ) -> AsyncGenerator[str | CreateResult, None]:
        """Stream from the wrapped client inside an ``llm`` span (closed with the final result)."""
        key = self._open(messages, tools)
        rec = self._recorder_for(key)
        result: CreateResult | None = None
        try:
            async for item in self.inner.create_stream(
                messages,
                tools=tools,
                tool_choice=tool_choice,
                json_output=json_output,
                extra_create_args=extra_create_args,
                cancellation_token=cancellation_token,
                **kwargs,
            ):
                if isinstance(item, CreateResult):
                    result = item
                yield item
        except BaseException as exc:
            rec.end(key, error=exc)
            raise
        rec.end(key, output=None if result is None else _result(result))

    async def close(self) -> None:
        """Close the wrapped client."""
        await self.inner.close()

    def actual_usage(self) -> Any:
        """The wrapped client's usage."""
        return self.inner.actual_usage()

    def total_usage(self) -> Any:
        """The wrapped client's total usage."""
        return self.inner.total_usage()

    def count_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Any] = []) -> int:
        """The wrapped client's token count."""
        return self.inner.count_tokens(messages, tools=tools)

    def remaining_tokens(self, messages: Sequence[LLMMessage], *, tools: Sequence[Any] = []) -> int:
        """The wrapped client's remaining tokens."""
        return self.inner.remaining_tokens(messages, tools=tools)

    @property
    def capabilities(self) -> Any:
        """The wrapped client's capabilities."""
        return self.inner.capabilities

    @property
    def model_info(self) -> Any:
        """The wrapped client's model info."""
        return self.inner.model_info


class LightningEventHandler(logging.Handler):
    """A ``logging.Handler`` for AutoGen's event loggers: LLM calls and tool calls become spans.

    Handles ``LLMCallEvent`` (``autogen_core.events``: an ``llm`` span with the response id, unless
    a :class:`LightningModelClient` is recording that call) and AgentChat's ``ToolCallRequestEvent``
    / ``ToolCallExecutionEvent`` (``autogen_agentchat.events``, DEBUG level: a ``tool`` span per
    call, with arguments, result, ``is_error`` status, ``tool_call_id`` and the agent's name).

    >>> import logging
    >>> from autogen_core import EVENT_LOGGER_NAME
    >>> handler = LightningEventHandler()
    >>> logging.getLogger(EVENT_LOGGER_NAME).addHandler(handler)  # doctest: +SKIP
    """

    def __init__(self, tracer: Tracer | Store | None = None, join: bool = True) -> None:
        super().__init__(level=logging.DEBUG)
        self.recorder = Recorder("autogen", tracer, join=join)
        #: set by :func:`instrument`: events go to this handler's own recorder only (never to another
        #: instrumentation's, which records them itself)
        self.scoped = False

    def _scope(self) -> tuple[Recorder, Any]:
        """The recorder and parent span key of an event now: this handler's own recorder under its own
        innermost span when it has one open (always its own for an instrument() handler), else the
        recorder of the span open here (an explicit handler's events join the instrumented agent's
        spans), else its own."""
        current = current_key.get()
        own = own_key(self.recorder, current)
        if own is not None or self.scoped:
            return self.recorder, own
        return handler_recorder(current) or self.recorder, current

    def emit(self, record: logging.LogRecord) -> None:
        """Record the event carried by ``record`` (other records are ignored)."""
        try:
            self.handle_event(record.msg)
        except Exception:  # tracing must never break the agent
            self.handleError(record)

    def handle_event(self, event: Any) -> None:
        """Record one AutoGen event object."""
        if isinstance(event, ToolCallRequestEvent):
            rec, parent = self._scope()
            for call in event.content:
                rec.start(
                    ("tool", call.id),
                    "tool",
                    call.name,
                    parent_key=parent,
                    agent=event.source,
                    input=json_or_text(call.arguments),
                    attributes={"tool_call_id": call.id},
                )
        elif isinstance(event, ToolCallExecutionEvent):
            rec, _ = self._scope()
            for res in event.content:
                rec.end(
                    ("tool", res.call_id), output=res.content, error=res.content if res.is_error else None
                )
        elif isinstance(event, LLMCallEvent):
            self._llm_call(event.kwargs)

    def _llm_call(self, kw: dict[str, Any]) -> None:
        response = kw.get("response") or {}
        rid = response.get("id") if isinstance(response, dict) else None
        active = _active_llm.get()
        if active is not None:  # a LightningModelClient records this call: just add the response id
            rec, key = active
            rec.set_response_id(key, rid)
            return
        choices = response.get("choices") if isinstance(response, dict) else None
        msg = (choices[0] or {}).get("message") if choices else None
        output = message_dict("assistant", msg.get("content"), msg.get("tool_calls")) if msg else None
        rec, parent = self._scope()
        key = object()
        rec.start(
            key,
            "llm",
            "create",
            parent_key=parent,
            agent=_agent_of(kw.get("agent_id")) if _own_caller(rec, parent) else None,
            input=kw.get("messages"),
            model=response.get("model") if isinstance(response, dict) else None,
            attributes={"agl.timing": "logged at the end of the call"},
        )
        rec.set_response_id(key, rid)
        rec.end(key, output=output)


_installed = Installed("autogen")


def instrument(tracer: Tracer | Store | None = None, join: bool = True) -> Instrumentation:
    """Record every AutoGen AgentChat run in this process, with no change to the agents.

    Installs a :class:`LightningEventHandler` on AutoGen's event loggers (lowering their level
    for this handler only: other handlers see what they saw before) and records each agent turn
    (``BaseChatAgent.run``/``run_stream``, a team's turn of a participant) as an ``agent`` span
    and each team run (``BaseGroupChat.run_stream``) as a ``chain`` span. LLM calls come from
    the ``LLMCallEvent`` log (joined by response id); wrap the client in
    :class:`LightningModelClient` for exact call timing and non-logging clients.
    ``handle.uninstrument()`` (or :func:`uninstrument`) restores everything. Calling it again for
    the same destination (the same ``tracer`` or store, or again none) shares the installation, so
    nothing is recorded twice; instrumentations for different destinations each record every run
    under their own spans. Either kind may be removed in any order.

    >>> from agentlightning_lite.adapters import autogen as agl_autogen
    >>> with agl_autogen.instrument() as handle:
    ...     handle.active
    True
    """
    key = (None if tracer is None else id(tracer), join)
    with hooks_lock:
        shared = _shared.get(key)
        if shared is not None:  # the same destination: one installation, counted
            shared[2] += 1
            return _installed.add(shared[0], functools.partial(_release, key))
    handler = LightningEventHandler(tracer, join=join)
    handler.scoped = True
    rec = handler.recorder
    undo_steps = [tap_logger(name, handler) for name in (CORE_LOGGER, AGENTCHAT_LOGGER)]

    patches = [
        (BaseChatAgent, "run", wrap_coroutine, "agent", lambda a: a.name),
        (BaseChatAgent, "run_stream", wrap_stream, "agent", lambda a: a.name),
        (ChatAgentContainer, "handle_request", wrap_coroutine, "agent", lambda c: c._agent.name),
        (
            BaseGroupChat,
            "run_stream",
            wrap_stream,
            "chain",
            lambda t: getattr(t, "name", None) or type(t).__name__,
        ),
    ]
    for cls, attr, wrap, kind, name_of in patches:
        undo_steps.append(patch_method(cls, attr, wrap(cls.__dict__[attr], rec, kind, name_of)))

    def undo() -> None:
        for step in reversed(undo_steps):
            step()

    with hooks_lock:
        _shared[key] = [handler, undo, 1]
    return _installed.add(handler, functools.partial(_release, key))


#: (id of the destination or None, join) -> [handler, undo, the instrumentations sharing it]; an entry
#: holds its destination (through the handler's recorder), so the id is not reused while it is here
_shared: dict[tuple[int | None, bool], list[Any]] = {}


def _release(key: tuple[int | None, bool]) -> None:
    """One instrumentation of ``key``'s destination removed: the installation goes with the last."""
    with hooks_lock:
        shared = _shared.get(key)
        if shared is None:
            return
        shared[2] -= 1
        if shared[2] > 0:
            return
        del _shared[key]
    shared[1]()


#: Remove every instrumentation :func:`instrument` installed and has not removed, the latest first.
uninstrument = _installed.uninstrument
