"""OpenAI Agents SDK adapter: a trace processor that records agents, model calls, tools and handoffs.

``add_trace_processor(LightningProcessor())`` or :func:`instrument` once. Our PolicyServer serves
the Responses API (the SDK's default model; its ``response`` spans are joined by the response id) and
Chat Completions (``generation`` spans): point the SDK's client at it (``OPENAI_BASE_URL``, or
``set_default_openai_client``), with the agent code unchanged.
"""

from __future__ import annotations

from typing import Any

from agents.tracing import TracingProcessor, get_trace_provider
from agents.tracing import add_trace_processor as _add_trace_processor

from .._json import json_or_text
from .._toolcalls import PendingCalls
from ..store.base import Store
from ..tracer import Tracer
from ._common import Installed, Instrumentation, Recorder, message_dict

__all__ = ["LightningProcessor", "instrument", "uninstrument"]

_SKIPPED = ("task", "turn")  # structural spans of the runner: their children hang under the agent span


def _dump(obj: Any) -> Any:
    dump = getattr(obj, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else obj


def _field(obj: Any, name: str) -> Any:
    """``obj.name`` of an SDK object or ``obj[name]`` of its ``model_dump()``."""
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


#: the placeholder id the SDK gives a Response it builds itself from Chat Completions chunks
_FAKE_ID = "__fake_id__"


def _responses_output(response: Any) -> dict[str, Any] | None:
    """A Responses API ``Response`` (object or dump) as one OpenAI assistant message (text, tool calls)."""
    if response is None:
        return None
    texts, calls = [], []
    for item in _field(response, "output") or ():
        kind = _field(item, "type")
        if kind == "message":
            for part in _field(item, "content") or ():
                if _field(part, "type") == "output_text":
                    texts.append(_field(part, "text") or "")
        elif kind == "function_call":
            calls.append(
                {
                    "id": _field(item, "call_id"),
                    "name": _field(item, "name"),
                    "arguments": _field(item, "arguments"),
                }
            )
    return message_dict("assistant", "".join(texts) or None, calls or None)


def _is_response_dump(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("output"), list)


def _chat_output(output: Any) -> Any:
    """A generation's recorded output as one assistant message.

    Non-streamed, the SDK records ``[message.model_dump()]`` (Chat Completions shape); streamed, it
    records ``[response.model_dump()]`` of the Responses-shaped ``Response`` it assembles from the chunks.
    """
    if isinstance(output, list) and len(output) == 1 and isinstance(output[0], dict):
        m = output[0]
        if _is_response_dump(m):
            return _responses_output(m)
        return message_dict("assistant", m.get("content"), m.get("tool_calls") or None)
    return output


def _streamed_response_id(output: Any) -> str | None:
    """The Chat Completions id (``chatcmpl-...``) a streamed generation saw, from its items' provider data."""
    if not (isinstance(output, list) and len(output) == 1 and _is_response_dump(output[0])):
        return None
    rid = output[0].get("id")
    if isinstance(rid, str) and rid and rid != _FAKE_ID:
        return rid
    for item in output[0]["output"]:
        data = item.get("provider_data") if isinstance(item, dict) else None
        rid = data.get("response_id") if isinstance(data, dict) else None
        if isinstance(rid, str) and rid:
            return rid
    return None


def _error(span: Any) -> str | None:
    err = getattr(span, "error", None)
    if not err:
        return None
    message = err.get("message") if isinstance(err, dict) else str(err)
    data = err.get("data") if isinstance(err, dict) else None
    detail = data.get("error") if isinstance(data, dict) else None
    return f"{message}: {detail}" if detail else str(message)


class LightningProcessor(TracingProcessor):
    """An Agents SDK trace processor that records each run into the current rollout.

    Mapping: a trace becomes a ``chain`` span, an agent an ``agent`` span named ``Agent.name``
    (the agent of every span under it), a generation (Chat Completions) or response (Responses
    API) an ``llm`` span, a function tool a ``tool`` span (arguments, result, error, and the model's
    ``tool_call_id``), a handoff or guardrail a ``custom`` span. LLM spans are joined with the
    PolicyServer's token-level spans when the trace ends.

    >>> from agents import add_trace_processor  # doctest: +SKIP
    >>> add_trace_processor(LightningProcessor())  # doctest: +SKIP
    """

    def __init__(self, tracer: Tracer | Store | None = None, join: bool = True) -> None:
        self.recorder = Recorder("openai_agents", tracer, join=join)
        self._calls: dict[str, PendingCalls] = {}  # agent span -> tool calls its model asked for

    # -- traces ---------------------------------------------------------------------------
    def on_trace_start(self, trace: Any) -> None:
        """Open the run's root ``chain`` span."""
        self.recorder.start(trace.trace_id, "chain", getattr(trace, "name", None) or "agent_workflow")

    def on_trace_end(self, trace: Any) -> None:
        """Close the root span (and join the run's LLM spans)."""
        self.recorder.end(trace.trace_id)

    # -- spans ----------------------------------------------------------------------------
    def on_span_start(self, span: Any) -> None:
        """Open the span matching the SDK span's type."""
        data = span.span_data
        kind_name = data.type
        parent = span.parent_id or span.trace_id
        if kind_name in _SKIPPED:
            self.recorder.skip(span.span_id, parent)
            return
        if kind_name == "agent":
            self.recorder.start(
                span.span_id,
                "agent",
                data.name,
                parent_key=parent,
                agent=data.name,
                attributes={"tools": data.tools, "handoffs": data.handoffs},
            )
        elif kind_name in ("generation", "response"):
            model = getattr(data, "model", None)
            attrs = {"api": "chat.completions" if kind_name == "generation" else "responses"}
            self.recorder.start(
                span.span_id, "llm", kind_name, parent_key=parent, model=model, attributes=attrs
            )
        elif kind_name == "function":
            self.recorder.start(span.span_id, "tool", data.name, parent_key=parent)
        elif kind_name == "handoff":
            self.recorder.start(
                span.span_id, "custom", "handoff", parent_key=parent, agent=data.from_agent or None
            )
        else:
            self.recorder.start(
                span.span_id, "custom", getattr(data, "name", None) or kind_name, parent_key=parent
            )

    def on_span_end(self, span: Any) -> None:
        """Close the span with what the SDK recorded: inputs, outputs, errors."""
        data = span.span_data
        kind_name = data.type
        key = span.span_id
        if kind_name in _SKIPPED:
            self.recorder.forget(key)
            return
        h = self.recorder.get(key)
        if h is None:
            return
        error = _error(span)
        output: Any = None
        if kind_name == "generation":
            h.input = data.input
            output = _chat_output(data.output)
            self.recorder.set_response_id(key, _streamed_response_id(data.output))
            if data.model:
                h.model = str(data.model)
            if data.usage:
                h.attributes["usage"] = data.usage
            self._remember_calls(h.parent_id, output)
        elif kind_name == "response":
            response = data.response
            h.input = _dump(data.input) if data.input is not None else None
            output = _responses_output(response)
            if response is not None:
                h.model = getattr(response, "model", None) or h.model
                self.recorder.set_response_id(key, getattr(response, "id", None))
            self._remember_calls(h.parent_id, output)
        elif kind_name == "function":
            h.input = json_or_text(data.input)
            output = data.output
            pending = self._calls.get(h.parent_id or "")
            answered = pending.claim(data.name, data.input) if pending is not None else None
            if answered is not None and answered.id:
                h.attributes["tool_call_id"] = answered.id
        elif kind_name == "handoff":
            output = {"from_agent": data.from_agent, "to_agent": data.to_agent}
        elif kind_name == "guardrail":
            output = {"triggered": data.triggered}
            if data.triggered:
                error = error or f"guardrail {data.name} triggered"
        elif kind_name == "agent":
            self._calls.pop(h.span_id, None)
            output = {"output_type": data.output_type} if data.output_type else None
        elif kind_name == "custom":
            output = getattr(data, "data", None)
        self.recorder.end(key, output=output, error=error)

    # -- tool call ids --------------------------------------------------------------------
    def _remember_calls(self, agent_span_id: str | None, output: Any) -> None:
        if agent_span_id is None:
            return
        pending = self._calls.get(agent_span_id) or PendingCalls()
        pending.add(output)
        if pending:  # kept until the agent span ends
            self._calls[agent_span_id] = pending

    def shutdown(self) -> None:
        """Nothing to flush: spans are written to the store as they end."""

    def force_flush(self) -> None:
        """Nothing to flush: spans are written to the store as they end."""


_installed = Installed("openai_agents")


def instrument(tracer: Tracer | Store | None = None, join: bool = True) -> Instrumentation:
    """Record every Agents SDK run in this process: registers a :class:`LightningProcessor`.

    Uses the SDK's processor registry (``add_trace_processor``); the SDK's own exporter stays
    as it was. ``handle.uninstrument()`` (or :func:`uninstrument`) removes the processor.

    >>> from agentlightning_lite.adapters import openai_agents as agl_agents
    >>> with agl_agents.instrument() as handle:
    ...     handle.active
    True
    """
    processor = LightningProcessor(tracer, join=join)
    _add_trace_processor(processor)

    def undo() -> None:
        # the SDK has no remove_processor; _multi_processor is DefaultTraceProvider's, not the base class's
        multi = get_trace_provider()._multi_processor  # type: ignore[attr-defined]
        with multi._lock:
            multi._processors = tuple(p for p in multi._processors if p is not processor)

    return _installed.add(processor, undo)


#: Remove every instrumentation :func:`instrument` installed and has not removed, the latest first.
uninstrument = _installed.uninstrument
