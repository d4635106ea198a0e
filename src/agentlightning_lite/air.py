"""Automatic intermediate rewards (AIR): turn system signals in the trace into per-call rewards.

An AIR rule is any callable ``(spans, calls) -> list[IntermediateReward]``: ``spans`` are all the
spans of one rollout, ``calls`` the policy-model LLM spans in call order. Each reward names the
call it belongs to. :func:`agentlightning_lite.transitions` hands them to the credit rule.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from ._toolcalls import tool_calls
from .types import Span, check_reward

__all__ = ["AIRRule", "IntermediateReward", "Rule", "ToolStatus", "as_rules", "call_before"]


@dataclass(frozen=True)
class IntermediateReward:
    """A reward for the call at ``call_index``, caused by the span ``span_id``."""

    call_index: int
    value: float
    name: str
    span_id: str


AIRRule = Callable[[Sequence[Span], Sequence[Span]], "list[IntermediateReward]"]


def as_rules(air: AIRRule | Iterable[AIRRule] | None) -> list[AIRRule] | None:
    """``air=`` as a list: a single rule, a list (or any iterable) of rules, or ``None``.

    >>> import agentlightning_lite as agl
    >>> agl.air.as_rules(agl.air.ToolStatus(success=0.1))
    [ToolStatus(success=0.1, error=0.0, tools=None)]
    """
    if air is None:
        return None
    if callable(air):
        return [air]
    if isinstance(air, (str, bytes)) or not isinstance(air, Iterable):
        raise TypeError(f"air= takes a rule or a list of rules, got {type(air).__name__}")
    rules = list(air)
    for i, rule in enumerate(rules):
        if not callable(rule):
            raise TypeError(
                f"air= rule {i} is a {type(rule).__name__}, not a rule: "
                "use agl.air.ToolStatus(...), agl.air.Rule(...) or a function (spans, calls) -> rewards"
            )
    return rules


def call_before(calls: Sequence[Span], span: Span, agent: str | None = None) -> int | None:
    """Index of the last call that started at or before ``span`` (of ``agent`` if given).

    A span inside an LLM call's own subtree belongs to that call.
    """
    for i, c in enumerate(calls):
        if c.span_id == span.span_id or c.span_id == span.parent_id:
            return i
    best: int | None = None
    for i, c in enumerate(calls):
        if c.start_time > span.start_time:
            break
        if agent is None or c.agent == agent:
            best = i
    if best is None and agent is not None:
        return call_before(calls, span, None)
    return best


def requesting_call(calls: Sequence[Span], tool: Span) -> int | None:
    """The index of the LLM call that asked for ``tool``.

    Tried in order: an explicit ``llm_span_id`` attribute on the tool span; a ``tool_call_id``
    attribute matching a tool call in a call's output; the last call of the same agent that
    ended before the tool started; the last call that started before it.
    """
    explicit = tool.attributes.get("llm_span_id")
    if explicit:
        for i, c in enumerate(calls):
            if c.span_id == explicit:
                return i
    call_id = tool.attributes.get("tool_call_id")
    if call_id:
        for i in range(len(calls) - 1, -1, -1):
            if any(c.id == call_id for c in tool_calls(calls[i].output)):
                return i
    best: int | None = None
    for i, c in enumerate(calls):
        if (
            c.end_time is not None
            and c.end_time <= tool.start_time
            and (tool.agent is None or c.agent == tool.agent)
        ):
            best = i
    return best if best is not None else call_before(calls, tool, tool.agent)


@dataclass(frozen=True)
class ToolStatus:
    """Reward the LLM call that requested a tool with ``success`` or ``error`` by the tool's outcome.

    ``tools`` limits the rule to tools with these names.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("q") as ro:
    ...     with tracer.span("llm", "chat") as sp:
    ...         sp.set_output({"role": "assistant", "tool_calls": [{"id": "c1"}]})
    ...     with tracer.span("tool", "calculator", attributes={"tool_call_id": "c1"}) as t:
    ...         t.set_error("ZeroDivisionError")
    ...     ro.reward(1.0)
    >>> [t.reward for t in agl.transitions(tracer.store, credit=agl.credit.Discounted(1.0),
    ...                                    air=[agl.air.ToolStatus(success=0.1, error=-0.5)])]
    [0.5]
    """

    success: float = 0.0
    error: float = 0.0
    tools: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        check_reward(self.success, "success")
        check_reward(self.error, "error")

    def __call__(self, spans: Sequence[Span], calls: Sequence[Span]) -> list[IntermediateReward]:
        out = []
        for s in spans:
            if s.kind != "tool" or (self.tools is not None and s.name not in self.tools):
                continue
            idx = requesting_call(calls, s)
            if idx is None:
                continue
            ok = s.status == "ok"
            value = self.success if ok else self.error
            out.append(IntermediateReward(idx, value, f"tool_{'ok' if ok else 'error'}:{s.name}", s.span_id))
        return out


@dataclass(frozen=True)
class Rule:
    """Give ``reward`` to the call behind every span that matches ``predicate``.

    ``reward`` is a number or a function of the span. The call is the span itself for an LLM
    span, the call whose subtree holds the span, or else the last call that started before it.

    >>> import agentlightning_lite as agl
    >>> rule = agl.air.Rule(lambda s: s.kind == "signal" and s.name == "sql_ok", 0.2)
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("q") as ro:
    ...     with tracer.span("llm", "chat"):
    ...         pass
    ...     agl.emit_signal("sql_ok")
    >>> [t.reward for t in agl.transitions(tracer.store, credit=agl.credit.Discounted(), air=[rule])]
    [0.2]
    """

    predicate: Callable[[Span], bool]
    reward: float | Callable[[Span], float]
    name: str = "rule"

    def __call__(self, spans: Sequence[Span], calls: Sequence[Span]) -> list[IntermediateReward]:
        out = []
        for s in spans:
            if not self.predicate(s):
                continue
            idx = call_before(calls, s)
            if idx is None:
                continue
            raw = self.reward(s) if callable(self.reward) else self.reward
            value = check_reward(raw, f"air.Rule({self.name}) reward")
            if value is not None:
                out.append(IntermediateReward(idx, value, self.name, s.span_id))
        return out
