"""OpenAI Agents SDK adapter against the real SDK and a real PolicyServer."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
)
from agents.tracing import get_trace_provider, set_trace_processors
from openai import AsyncOpenAI

import agentlightning_lite as agl
from agentlightning_lite.adapters import openai_agents as agl_agents
from agentlightning_lite.adapters.openai_agents import LightningProcessor

from .conftest import assert_joined, assert_transitions_have_server_tokens, called_tools, system_text


@pytest.fixture(autouse=True)
def isolated_processors() -> Iterator[None]:
    """No SDK exporter (it would try to reach OpenAI); the registry restored after each test."""
    multi = get_trace_provider()._multi_processor
    before = multi._processors
    set_trace_processors([])
    yield
    agl_agents.uninstrument()
    set_trace_processors(list(before))


@function_tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _tool_failed(ctx: Any, error: Exception) -> str:
    return f"explode failed: {error}"


# A failure_error_function of its own: from openai-agents 0.21 the SDK redacts the error text of tools
# that use its default one ("Tool execution failed. Error details are redacted.") and keeps it otherwise.
@function_tool(failure_error_function=_tool_failed)
def explode(x: int) -> int:
    """A tool that always fails."""
    raise ValueError("kaboom")


def math_script(messages: list[dict[str, Any]]) -> Any:
    if "add" in called_tools(messages):
        return "The sum is 5."
    return {
        "tool_calls": [
            {"name": "add", "arguments": {"a": 2, "b": 3}},
            {"name": "explode", "arguments": {"x": 1}},
        ]
    }


def processors() -> list[Any]:
    """The trace processors registered with the SDK."""
    return list(get_trace_provider()._multi_processor._processors)


def chat_model(llm: agl.LLM) -> OpenAIChatCompletionsModel:
    return OpenAIChatCompletionsModel(
        model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    )


def test_single_agent_with_tools_explicit_processor(store, serve):
    tracer = agl.Tracer(store)
    server = serve(math_script, store)
    processor = LightningProcessor()
    set_trace_processors([processor])
    with tracer.rollout("2+3?") as ro:
        agent = Agent(
            name="math",
            instructions="You do math.",
            tools=[add, explode],
            model=chat_model(server.llm(ro.id)),
        )
        result = asyncio.run(Runner.run(agent, "2+3?"))
        ro.reward(1.0)
    assert result.final_output == "The sum is 5."
    assert processor.recorder.open_count() == 0
    spans = store.spans(ro.id)
    ours = [s for s in spans if s.attributes.get("agl.source") == "openai_agents"]
    root = ours[0]
    assert root.kind == "chain" and root.parent_id is None
    (agent_span,) = [s for s in ours if s.kind == "agent"]
    assert agent_span.name == "math" and agent_span.parent_id == root.span_id
    assert {s.agent for s in ours[1:]} == {"math"}
    pairs = assert_joined(store, ro.id, "openai_agents")
    assert len(pairs) == 2 and all(f.parent_id == agent_span.span_id for f, _ in pairs)
    asked = {c["function"]["name"]: c["id"] for c in pairs[0][1].output["tool_calls"]}
    tools = {s.name: s for s in ours if s.kind == "tool"}
    assert tools["add"].status == "ok" and tools["add"].output == 5 and tools["add"].input == {"a": 2, "b": 3}
    assert tools["explode"].status == "error" and "kaboom" in tools["explode"].error
    assert tools["explode"].error.startswith("Error running tool")
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    ts = assert_transitions_have_server_tokens(
        store, ro.id, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:explode", -0.5)]


def triage_script(messages: list[dict[str, Any]]) -> Any:
    if "triage" in system_text(messages):
        return {"tool_calls": [{"name": "transfer_to_math", "arguments": {}}]}
    return math_script(messages)


@pytest.fixture
def sdk_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Point the SDK's default client at a server through its own environment variables only.

    The SDK keeps one httpx client for its default provider for the whole process; its pooled
    connections belong to the event loop of the run that opened them, and each test runs its own
    ``asyncio.run``, so the shared client is dropped before and after (one program, one loop, never
    needs this)."""
    from agents.models import openai_provider

    def point(llm: agl.LLM) -> None:
        monkeypatch.setenv("OPENAI_BASE_URL", llm.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", llm.api_key)

    monkeypatch.setattr(openai_provider, "_http_client", None)
    yield point
    openai_provider._http_client = None


def test_default_responses_model_multi_agent_zero_code(store, serve, sdk_environment):
    """The SDK as it comes: its default model is the Responses API (``OpenAIResponsesModel``); the
    agent code is unchanged, only the SDK's own environment variables point it at the server."""
    tracer = agl.Tracer(store)
    server = serve(triage_script, store)
    handle = agl_agents.instrument()
    try:
        with tracer.rollout("2+3?") as ro:
            llm = server.llm(ro.id)
            sdk_environment(llm)
            math = Agent(name="math", instructions="You do math.", tools=[add, explode], model=llm.model)
            triage = Agent(name="triage", instructions="You are triage.", handoffs=[math], model=llm.model)
            result = asyncio.run(Runner.run(triage, "2+3?"))
            ro.reward(1.0)
    finally:
        handle.uninstrument()
    assert result.final_output == "The sum is 5."
    spans = store.spans(ro.id)
    server_spans = [s for s in spans if s.attributes.get("server") == "agl"]
    assert [s.attributes["api"] for s in server_spans] == ["responses"] * 3  # not chat completions
    pairs = assert_joined(store, ro.id, "openai_agents")
    assert [f.name for f, _ in pairs] == ["response"] * 3  # the SDK's response spans, not generation
    assert [f.agent for f, _ in pairs] == ["triage", "math", "math"]
    assert [f.attributes["agl.response_id"] for f, _ in pairs] == [
        s.attributes["request_id"] for _, s in pairs
    ]
    asked = {c["function"]["name"]: c["id"] for c in pairs[1][1].output["tool_calls"]}
    tools = {s.name: s for s in spans if s.kind == "tool"}
    assert tools["add"].status == "ok" and tools["explode"].status == "error"
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    # the tool results went back to the model as function_call_output items
    assert [m["role"] for m in pairs[2][1].input[-2:]] == ["tool", "tool"]
    ts = assert_transitions_have_server_tokens(
        store, ro.id, agents=["math"], air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert [t.agent for t in ts] == ["math", "math"]
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:explode", -0.5)]


def test_default_responses_model_streamed_run(store, serve, sdk_environment):
    """Runner.run_streamed on the default Responses model: the SDK reads the server's Responses
    events (it fails without ``response.completed``) and its spans join the server's."""

    async def run_streamed(agent: Agent, question: str) -> tuple[Any, list[str]]:
        result = Runner.run_streamed(agent, question)
        kinds = [event.type async for event in result.stream_events()]
        return result.final_output, kinds

    tracer = agl.Tracer(store)
    server = serve(triage_script, store)
    set_trace_processors([LightningProcessor()])
    with tracer.rollout("2+3?") as ro:
        llm = server.llm(ro.id)
        sdk_environment(llm)
        math = Agent(name="math", instructions="You do math.", tools=[add, explode], model=llm.model)
        triage = Agent(name="triage", instructions="You are triage.", handoffs=[math], model=llm.model)
        final, kinds = asyncio.run(run_streamed(triage, "2+3?"))
    assert final == "The sum is 5." and "raw_response_event" in kinds
    server_spans = [s for s in store.spans(ro.id) if s.attributes.get("server") == "agl"]
    assert all(s.attributes["params"]["stream"] and s.attributes["api"] == "responses" for s in server_spans)
    pairs = assert_joined(store, ro.id, "openai_agents")
    assert [f.agent for f, _ in pairs] == ["triage", "math", "math"]
    ts = assert_transitions_have_server_tokens(store, ro.id)
    assert [t.agent for t in ts] == ["triage", "math", "math"]


def test_handoff_multi_agent_zero_code_with_chat_completions_switch(store, serve):
    def script(messages):
        if "triage" in system_text(messages):
            return {"tool_calls": [{"name": "transfer_to_math", "arguments": {}}]}
        return math_script(messages)

    tracer = agl.Tracer(store)
    server = serve(script, store)
    handle = agl_agents.instrument()
    assert processors().count(handle.handler) == 1
    try:
        with tracer.rollout("2+3?") as ro:
            llm = server.llm(ro.id)
            # the SDK's Chat Completions path (the default, Responses, is tested above)
            set_default_openai_api("chat_completions")
            set_default_openai_client(
                AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key), use_for_tracing=False
            )
            math = Agent(name="math", instructions="You do math.", tools=[add, explode], model=llm.model)
            triage = Agent(name="triage", instructions="You are triage.", handoffs=[math], model=llm.model)
            result = asyncio.run(Runner.run(triage, "2+3?"))
    finally:
        set_default_openai_api("responses")
        handle.uninstrument()
    assert result.final_output == "The sum is 5."
    pairs = assert_joined(store, ro.id, "openai_agents")
    assert [f.agent for f, _ in pairs] == ["triage", "math", "math"]
    ours = [s for s in store.spans(ro.id) if s.attributes.get("agl.source") == "openai_agents"]
    agents = {s.name: s for s in ours if s.kind == "agent"}
    assert set(agents) == {"triage", "math"}
    (handoff,) = [s for s in ours if s.name == "handoff"]
    assert handoff.agent == "triage" and handoff.output == {"from_agent": "triage", "to_agent": "math"}
    assert handoff.parent_id == agents["triage"].span_id
    ts = assert_transitions_have_server_tokens(store, ro.id, agents=["math"])
    assert [t.agent for t in ts] == ["math", "math"]

    # uninstrumented: the processor is gone, and a new run (one model call, on the server) records
    # nothing of the SDK's own
    assert not handle.active and processors() == []
    with tracer.rollout("again") as ro2:
        asyncio.run(Runner.run(Agent(name="math", model=chat_model(server.llm(ro2.id))), "2+3?"))
    assert [s.attributes.get("server") for s in store.spans(ro2.id)] == ["agl"]


def test_streamed_run_with_handoff_and_tools_is_joined(store, serve):
    """Runner.run_streamed: the SDK records each generation as a Responses-shaped ``{"output": [...]}``."""

    def script(messages):
        if "triage" in system_text(messages):
            return {"tool_calls": [{"name": "transfer_to_math", "arguments": {}}]}
        return math_script(messages)

    async def run_streamed(agent: Agent, question: str) -> tuple[Any, list[str]]:
        result = Runner.run_streamed(agent, question)
        kinds = [event.type async for event in result.stream_events()]
        return result.final_output, kinds

    tracer = agl.Tracer(store)
    server = serve(script, store)
    processor = LightningProcessor()
    set_trace_processors([processor])
    with tracer.rollout("2+3?") as ro:
        llm = server.llm(ro.id)
        math = Agent(name="math", instructions="You do math.", tools=[add, explode], model=chat_model(llm))
        triage = Agent(name="triage", instructions="You are triage.", handoffs=[math], model=chat_model(llm))
        final, kinds = asyncio.run(run_streamed(triage, "2+3?"))
        ro.reward(1.0)
    assert final == "The sum is 5." and "raw_response_event" in kinds  # it did stream
    assert processor.recorder.open_count() == 0
    spans = store.spans(ro.id)
    server_spans = [s for s in spans if s.attributes.get("server") == "agl"]
    assert len(server_spans) == 3 and all(s.attributes["params"]["stream"] for s in server_spans)
    pairs = assert_joined(store, ro.id, "openai_agents")
    assert [f.agent for f, _ in pairs] == ["triage", "math", "math"]
    # joined by the Chat Completions id the SDK saw in the stream
    assert [f.attributes["agl.response_id"] for f, _ in pairs] == [
        s.attributes["request_id"] for _, s in pairs
    ]
    assert pairs[1][0].output["tool_calls"][0]["function"]["name"] == "add"
    assert pairs[2][0].output == {"role": "assistant", "content": "The sum is 5."}
    asked = {c["function"]["name"]: c["id"] for c in pairs[1][1].output["tool_calls"]}
    tools = {s.name: s for s in spans if s.kind == "tool"}
    assert {n: t.attributes.get("tool_call_id") for n, t in tools.items()} == asked
    assert {t.agent for t in tools.values()} == {"math"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not served by the PolicyServer" warning
        ts = assert_transitions_have_server_tokens(store, ro.id, agents=["math"])
    assert [t.agent for t in ts] == ["math", "math"]
    assert [t.metadata["span_id"] for t in ts] == [s.span_id for _, s in pairs[1:]]


def test_n_choices_joined_by_timing_all_get_the_agent(store, serve):
    """n=2 through the SDK's non-streamed path (no response id: joined by timing and reply)."""
    tracer = agl.Tracer(store)
    server = serve(["4", "four"], store)
    set_trace_processors([LightningProcessor()])
    with tracer.rollout("2+2?") as ro:
        agent = Agent(
            name="solo",
            model=chat_model(server.llm(ro.id)),
            model_settings=ModelSettings(extra_args={"n": 2}),
        )
        assert asyncio.run(Runner.run(agent, "2+2?")).final_output == "4"  # the SDK keeps the first choice
    spans = store.spans(ro.id)
    (f,) = [s for s in spans if s.kind == "llm" and s.attributes.get("agl.source") == "openai_agents"]
    assert "agl.response_id" not in f.attributes
    servers = [s for s in spans if s.attributes.get("server") == "agl"]
    assert [(s.output["content"], s.attributes["choice_index"]) for s in servers] == [("4", 0), ("four", 1)]
    assert f.attributes["agl.duplicate_of"] == servers[0].span_id
    assert all(s.agent == "solo" and s.parent_id == f.span_id for s in servers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ts = assert_transitions_have_server_tokens(store, ro.id, agents=["solo"])
    assert [t.response["content"] for t in ts] == ["4", "four"]


def test_responses_api_on_a_foreign_endpoint_is_recorded_without_tokens(store, foreign_endpoint):
    """The Responses path (what the SDK uses by default) against a model that is not ours."""

    def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path.endswith("/responses") and body["model"] == "gpt-other"
        return {
            "id": "resp_123",
            "object": "response",
            "created_at": 0,
            "model": "gpt-other",
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "4", "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": 5,
                "output_tokens": 1,
                "total_tokens": 6,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }

    client = AsyncOpenAI(base_url=foreign_endpoint(answer), api_key="k", max_retries=0)
    tracer = agl.Tracer(store)
    set_trace_processors([LightningProcessor()])
    with tracer.rollout("2+2?") as ro:
        agent = Agent(name="solo", model=OpenAIResponsesModel(model="gpt-other", openai_client=client))
        assert asyncio.run(Runner.run(agent, "2+2?")).final_output == "4"
    (llm_span,) = [s for s in store.spans(ro.id) if s.kind == "llm"]
    assert llm_span.name == "response" and llm_span.agent == "solo"
    assert llm_span.output == {"role": "assistant", "content": "4"}
    assert llm_span.attributes["agl.response_id"] == "resp_123"
    assert llm_span.attributes["agl.has_tokens"] is False
    with pytest.warns(RuntimeWarning, match=r"1 from openai_agents"):
        assert agl.transitions(store) == []


@pytest.mark.slow
def test_openai_agents_with_hf_engine(store, hf_engine):
    from agentlightning_lite.serving import PolicyServer

    tracer = agl.Tracer(store)
    set_trace_processors([LightningProcessor()])
    with PolicyServer(hf_engine, store) as server, tracer.rollout("hi") as ro:
        agent = Agent(
            name="greeter",
            instructions="Greet.",
            model=chat_model(server.llm(ro.id)),
            model_settings=ModelSettings(max_tokens=4, temperature=0.0),
        )
        out = asyncio.run(Runner.run(agent, "Say hi.")).final_output
    (pair,) = assert_joined(store, ro.id, "openai_agents")
    assert pair[0].output["content"] == out
    (t,) = assert_transitions_have_server_tokens(store, ro.id)
    assert t.agent == "greeter" and len(t.response_token_ids) <= 4
