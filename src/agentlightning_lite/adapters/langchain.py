"""LangChain / LangGraph adapter: a callback handler that records chains, LLM calls and tools as spans.

Pass ``LightningCallback()`` in ``config={"callbacks": [...]}``, or call :func:`instrument` once to
have every LangChain run in the process recorded (LangChain's configure hook).
"""

from __future__ import annotations

import contextvars
import functools
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage, ToolMessage, convert_to_openai_messages
from langchain_core.tracers import context as _lc_context

from ..store.base import Store
from ..tracer import Tracer
from ._common import Installed, Instrumentation, Recorder, message_dict

__all__ = ["LightningCallback", "instrument", "uninstrument"]

#: LangGraph runs that are plumbing, not steps of the agent (their children attach to their parent)
_HIDDEN_TAG = "langsmith:hidden"
_CONTROL_FLOW = ("GraphInterrupt", "ParentCommand", "GraphBubbleUp", "NodeInterrupt")


@functools.lru_cache(maxsize=1)
def _default_names() -> frozenset[str]:
    """Class names LangChain/LangGraph give runs that were not named by the user."""
    from langchain_core.runnables import Runnable

    names: set[str] = {"LangGraph", "RunnableSequence", "RunnableParallel", "RunnableLambda"}
    stack: list[type] = [Runnable]
    while stack:
        cls = stack.pop()
        names.add(cls.__name__)
        stack.extend(cls.__subclasses__())
    return frozenset(names)


def _is_default_name(name: str) -> bool:
    return name.split("<", 1)[0] in _default_names()


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Messages as OpenAI dicts; containers walked a little; everything else left to the store."""
    if isinstance(value, BaseMessage):
        return _message(value)
    if depth < 3:
        if isinstance(value, dict):
            return {k: _jsonable(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_jsonable(v, depth + 1) for v in value]
    return value


def _message(m: BaseMessage) -> dict[str, Any]:
    try:
        return convert_to_openai_messages(m)
    except Exception:  # an unusual message type: keep what it says
        return {"role": m.type, "content": m.content}


def _response_id(response: Any, message: Any) -> str | None:
    rid = (getattr(response, "llm_output", None) or {}).get("id")
    if not rid and message is not None:
        rid = (getattr(message, "response_metadata", None) or {}).get("id")
        if not rid and isinstance(getattr(message, "id", None), str) and message.id.startswith("chatcmpl"):
            rid = message.id
    return rid if isinstance(rid, str) else None


class LightningCallback(BaseCallbackHandler):
    """A LangChain callback handler that records a run (chains, LLM calls, tools) into the current rollout.

    Every span gets the agent's name: ``metadata={"agent": ...}`` of the run (inherited by its
    children), else the ``run_name`` of the enclosing named runnable (a LangGraph node name
    counts), else the root run's name. LLM spans are joined with the PolicyServer's token-level
    spans when the outermost run ends. Works for LangGraph graphs too.

    Args:
        tracer: an ``agl.Tracer`` or store to record into; default: the rollout open where the
            chain runs (``with tracer.rollout(...)``).
        join: join LLM spans with the server's spans when a run ends (else ``transitions()`` does).

    >>> import agentlightning_lite as agl
    >>> from agentlightning_lite.adapters.langchain import LightningCallback
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("2+2?") as ro:  # doctest: +SKIP
    ...     chain.invoke({"q": "2+2?"}, config={"callbacks": [LightningCallback()],
    ...                                          "metadata": {"agent": "solver"}})
    >>> {s.agent for s in tracer.store.spans(ro.id)}  # doctest: +SKIP
    {'solver'}
    """

    raise_error = False
    run_inline = True

    def __init__(self, tracer: Tracer | Store | None = None, join: bool = True) -> None:
        super().__init__()
        self.recorder = Recorder("langchain", tracer, join=join)
        self._explicit: dict[UUID, bool] = {}  # run -> its agent name was chosen by the user

    # -- agent names ------------------------------------------------------------------------
    def _agent(
        self, name: str, metadata: dict[str, Any] | None, parent_run_id: UUID | None, own_name: bool
    ) -> tuple[str | None, bool]:
        md = metadata or {}
        if md.get("agent"):
            return str(md["agent"]), True
        parent = self.recorder.get(parent_run_id) if parent_run_id is not None else None
        parent_key = self.recorder.resolve(parent_run_id) if parent_run_id is not None else None
        if parent is not None and parent_key is not None and self._explicit.get(parent_key, False):
            return parent.agent, True
        node = md.get("langgraph_node")
        if isinstance(node, str) and node and not node.startswith("__"):
            return node, True
        if own_name and name and not _is_default_name(name):
            return name, True
        if parent is not None:
            return parent.agent, False
        return name or None, False

    def _start(
        self,
        run_id: UUID,
        parent_run_id: UUID | None,
        kind: str,
        name: str,
        metadata: dict[str, Any] | None,
        tags: list[str] | None,
        input: Any,
        own_name: bool,
        attributes: dict[str, Any] | None = None,
        model: str | None = None,
    ) -> None:
        agent, explicit = self._agent(name, metadata, parent_run_id, own_name)
        parent_explicit = parent_run_id is not None and self._explicit.get(
            self.recorder.resolve(parent_run_id), False
        )
        if kind == "chain" and explicit and not parent_explicit:
            kind = "agent"  # the run where a named agent starts
        h = self.recorder.start(
            run_id,
            kind,
            name,
            parent_key=parent_run_id,
            agent=agent,
            input=input,
            attributes=attributes,
            model=model,
        )
        if h is not None:
            self._explicit[run_id] = explicit

    def _end(self, run_id: UUID, output: Any = None, error: Any = None, **attrs: Any) -> None:
        self._explicit.pop(run_id, None)
        self.recorder.forget(run_id)
        self.recorder.end(run_id, output=output, error=error, attributes=attrs or None)

    # -- chains -----------------------------------------------------------------------------
    def on_chain_start(
        self,
        serialized: dict[str, Any] | None,
        inputs: Any,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a ``chain`` span (an ``agent`` span where a named agent starts)."""
        name = kwargs.get("name") or (serialized or {}).get("name") or "chain"
        if tags and _HIDDEN_TAG in tags and parent_run_id is not None:
            self.recorder.skip(run_id, parent_run_id)
            return
        self._start(run_id, parent_run_id, "chain", name, metadata, tags, _jsonable(inputs), True)

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the chain's span with its outputs."""
        self._end(run_id, output=_jsonable(outputs))

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the chain's span as failed (LangGraph control flow such as interrupts is not an error)."""
        if type(error).__name__ in _CONTROL_FLOW:
            self._end(run_id, control_flow=type(error).__name__)
        else:
            self._end(run_id, error=error)

    # -- LLM calls --------------------------------------------------------------------------
    def on_chat_model_start(
        self,
        serialized: dict[str, Any] | None,
        messages: list[list[BaseMessage]],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an ``llm`` span with the prompt as OpenAI messages."""
        params = kwargs.get("invocation_params") or {}
        name = kwargs.get("name") or (serialized or {}).get("name") or "chat_model"
        model = params.get("model") or params.get("model_name") or (metadata or {}).get("ls_model_name")
        prompt = [_message(m) for m in messages[0]] if len(messages) == 1 else _jsonable(messages)
        attrs: dict[str, Any] = {}
        if params.get("tools"):
            attrs["tools"] = params["tools"]
        self._start(run_id, parent_run_id, "llm", name, metadata, tags, prompt, False, attrs, model)

    def on_llm_start(
        self,
        serialized: dict[str, Any] | None,
        prompts: list[str],
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open an ``llm`` span for a text-completion model."""
        params = kwargs.get("invocation_params") or {}
        name = kwargs.get("name") or (serialized or {}).get("name") or "llm"
        prompt = prompts[0] if len(prompts) == 1 else prompts
        model = params.get("model") or params.get("model_name")
        self._start(run_id, parent_run_id, "llm", name, metadata, tags, prompt, False, None, model)

    def on_llm_end(self, response: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the ``llm`` span with the reply (an OpenAI assistant message) and its response id."""
        gens = getattr(response, "generations", None) or [[]]
        gen = gens[0][0] if gens and gens[0] else None
        message = getattr(gen, "message", None)
        if message is not None:
            output: Any = message_dict(
                "assistant", message.content, getattr(message, "tool_calls", None) or None
            )
        else:
            output = getattr(gen, "text", None)
        self.recorder.set_response_id(run_id, _response_id(response, message))
        self._end(run_id, output=output)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the ``llm`` span as failed."""
        self._end(run_id, error=error)

    # -- tools ------------------------------------------------------------------------------
    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        parent_run_id: UUID | None = None,
        tags: list[str] | None = None,
        metadata: dict[str, Any] | None = None,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Open a ``tool`` span with the arguments (and the model's ``tool_call_id``)."""
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        attrs = {}
        if kwargs.get("tool_call_id"):
            attrs["tool_call_id"] = kwargs["tool_call_id"]
        args = inputs if inputs is not None else input_str
        self._start(run_id, parent_run_id, "tool", name, metadata, tags, args, False, attrs)

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the ``tool`` span with the result; a ``ToolMessage`` with status ``error`` fails it."""
        if isinstance(output, ToolMessage):
            error = output.content if output.status == "error" else None
            self._end(run_id, output=output.content, error=error and str(error))
        else:
            self._end(run_id, output=_jsonable(output))

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        """Close the ``tool`` span as failed."""
        self._end(run_id, error=error)


_installed = Installed("langchain")


def instrument(tracer: Tracer | Store | None = None, join: bool = True) -> Instrumentation:
    """Record every LangChain/LangGraph run in this process, with no change to the chains.

    Registers a :class:`LightningCallback` with LangChain's configure hook, so every callback
    manager gets it. Returns a handle: ``handle.uninstrument()`` (or :func:`uninstrument`) removes it.

    >>> from agentlightning_lite.adapters import langchain as agl_langchain
    >>> handle = agl_langchain.instrument()
    >>> handle.active
    True
    >>> handle.uninstrument()
    """
    handler = LightningCallback(tracer, join=join)
    var: contextvars.ContextVar[Any] = contextvars.ContextVar(f"agl_langchain_{id(handler)}", default=handler)
    _lc_context.register_configure_hook(var, True)

    def undo() -> None:
        _lc_context._configure_hooks[:] = [h for h in _lc_context._configure_hooks if h[0] is not var]

    return _installed.add(handler, undo)


#: Remove every instrumentation :func:`instrument` installed and has not removed, the latest first.
uninstrument = _installed.uninstrument
