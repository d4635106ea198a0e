"""What the adapters share: the installation registry, JSON-or-text, reading and matching tool calls."""

from __future__ import annotations

import pytest

import agentlightning_lite as agl
from agentlightning_lite._json import json_or_text
from agentlightning_lite._toolcalls import PendingCalls, ToolCall, tool_calls
from agentlightning_lite.adapters._common import Installed
from agentlightning_lite.air import requesting_call

ASKED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
        {"id": "c2", "type": "function", "function": {"name": "explode", "arguments": '{"x": 1}'}},
    ],
}


def test_installed_undoes_the_latest_first_and_forgets_what_it_removed() -> None:
    installed, undone = Installed("demo"), []
    handles = [installed.add(f"h{i}", lambda i=i: undone.append(i)) for i in range(3)]
    assert len(installed) == 3 and [h.handler for h in handles] == ["h0", "h1", "h2"]
    handles[1].uninstrument()
    assert undone == [1] and len(installed) == 2 and not handles[1].active
    installed.uninstrument()
    assert undone == [1, 2, 0] and len(installed) == 0
    assert not any(h.active for h in handles)
    installed.uninstrument()  # nothing left: nothing undone twice
    assert undone == [1, 2, 0]


def test_a_failing_undo_still_leaves_the_registry() -> None:
    installed = Installed("demo")

    def broken() -> None:
        raise RuntimeError("framework changed")

    handle = installed.add(None, broken)
    with pytest.raises(RuntimeError, match="framework changed"):
        handle.uninstrument()
    assert len(installed) == 0 and not handle.active


def test_json_or_text() -> None:
    assert json_or_text('{"a": [1, 2]}') == {"a": [1, 2]}
    assert json_or_text("not json") == "not json"
    assert json_or_text("") == ""
    assert json_or_text(None) is None and json_or_text({"a": 1}) == {"a": 1}
    assert json_or_text("true") is True and json_or_text("true", containers_only=True) == "true"
    deep = "[" * 100_000  # deeper than the decoder can go: text, never an exception
    assert json_or_text(deep) == deep and json_or_text(deep, containers_only=True) == deep


def test_one_reading_of_tool_calls_in_every_output_shape() -> None:
    expected = [ToolCall("c1", "add", {"a": 2, "b": 3}), ToolCall("c2", "explode", {"x": 1})]
    completion = {"id": "chatcmpl-1", "choices": [{"index": 0, "message": ASKED}]}
    flat = {
        "tool_calls": [
            {"id": "c1", "name": "add", "args": {"a": 2, "b": 3}},  # LangChain's shape
            {"id": "c2", "name": "explode", "arguments": {"x": 1}},
        ]
    }
    for output in (ASKED, [ASKED], completion, flat):
        assert tool_calls(output) == expected
        pending = PendingCalls()
        pending.add(output)
        assert list(pending) == expected
    assert tool_calls("plain text") == [] and tool_calls(None) == []
    assert tool_calls({"tool_calls": [{"id": 7, "name": "add"}]}) == [ToolCall(None, "add", None)]


def test_air_finds_the_requesting_call_by_id_in_a_completion_shaped_output() -> None:
    def span(i: str, kind: str, t: float, **kw: object) -> agl.Span:
        return agl.Span(span_id=i, rollout_id="r", kind=kind, start_time=t, end_time=t + 0.1, **kw)

    calls = [
        span("l1", "llm", 0.0, output={"choices": [{"message": ASKED}]}),
        span("l2", "llm", 1.0, output="thinking"),  # the latest call before the tool: timing picks this one
    ]
    tool = span("t", "tool", 2.0, name="add", attributes={"tool_call_id": "c1"})
    assert requesting_call(calls, tool) == 0


def test_claim_prefers_equal_arguments_else_the_first_call_of_that_name() -> None:
    """The call a tool run answers: one rule for every adapter.

    Where the CrewAI adapter's rule used to differ (it fell back to a call whose arguments differ
    only when that call was the last one asked), the first call of the tool's name is taken.
    """
    pending = PendingCalls()
    pending.add(ASKED)
    # the framework ran add with its arguments coerced (strings): still the model's add call
    assert pending.claim("add", {"a": "2", "b": "3"}) == ToolCall("c1", "add", {"a": 2, "b": 3})
    assert pending.claim("add", {"a": 2, "b": 3}) is None  # answered calls are not offered again
    assert pending.claim("explode", '{"x": 1}').id == "c2" and len(pending) == 0

    twice = PendingCalls()
    two_adds = [{"id": "a", "name": "add", "args": {"a": 1}}, {"id": "b", "name": "add", "args": {"a": 2}}]
    twice.add({"tool_calls": two_adds})
    assert twice.claim("add", {"a": 2}).id == "b"  # equal arguments win over order
    assert twice.claim("add", "a=1").id == "a"

    timed = PendingCalls()
    timed.add(ASKED, asked_at=10.0)
    assert timed.claim("add", None, started_at=9.0) is None  # asked after the tool started: not its call
    assert timed.claim("add", None, started_at=9.96).id == "c1"  # within the clock slack


def test_tool_arguments_nested_deeper_than_the_decoder_goes_do_not_stop_the_join() -> None:
    """A degenerate model can write ``[[[[...`` as a tool call's arguments: such text is compared as
    text when an adapter's LLM span is joined with the server's, and transitions() still come out."""
    deep = "[" * 2_000
    call = {"id": "c1", "function": {"name": "add", "arguments": deep}}
    reply = {"role": "assistant", "tool_calls": [call]}
    store = agl.MemoryStore()
    rid = store.start_rollout("q").rollout_id
    framework = agl.Span(
        span_id="f", rollout_id=rid, kind="llm", name="chat", agent="solver", start_time=0.0, end_time=2.0,
        output=reply, attributes={"agl.source": "langchain"},
    )  # fmt: skip
    server = agl.Span(
        span_id="s", rollout_id=rid, kind="llm", name="chat", start_time=0.5, end_time=1.5, output=reply,
        attributes={"server": "agl"}, prompt_token_ids=[1, 2], response_token_ids=[3],
        response_logprobs=[-0.5],
    )  # fmt: skip
    store.add_spans([framework, server])
    store.finish_rollout(rid, reward=1.0)
    (t,) = agl.transitions(store, rollout_ids=[rid])
    assert t.agent == "solver" and t.response_token_ids == [3] and t.metadata["span_id"] == "s"
