"""AutoGen AgentChat adapter against the real AgentChat 0.7 and a real PolicyServer."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

pytest.importorskip("autogen_agentchat")
pytest.importorskip("autogen_ext.models.openai")

from autogen_agentchat import EVENT_LOGGER_NAME as AGENTCHAT_LOGGER
from autogen_agentchat.agents import AssistantAgent, BaseChatAgent
from autogen_agentchat.conditions import MaxMessageTermination
from autogen_agentchat.messages import SelectSpeakerEvent
from autogen_agentchat.teams import BaseGroupChat, RoundRobinGroupChat, SelectorGroupChat
from autogen_agentchat.teams._group_chat._chat_agent_container import ChatAgentContainer
from autogen_core import EVENT_LOGGER_NAME as CORE_LOGGER
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning_lite as agl
from agentlightning_lite.adapters import autogen as agl_autogen
from agentlightning_lite.adapters.autogen import LightningEventHandler, LightningModelClient

from .conftest import assert_joined, assert_transitions_have_server_tokens, called_tools, system_text

INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": "unknown",
    "structured_output": False,
}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def explode(x: int) -> int:
    """A tool that always fails."""
    raise ValueError("kaboom")


def script(messages: list[dict[str, Any]]) -> Any:
    if "checker" in system_text(messages):
        return "LGTM"
    if "add" in called_tools(messages):
        return "The sum is 5."
    return {
        "tool_calls": [
            {"name": "add", "arguments": {"a": 2, "b": 3}},
            {"name": "explode", "arguments": {"x": 1}},
        ]
    }


def client(llm: agl.LLM, **kwargs: Any) -> OpenAIChatCompletionClient:
    return OpenAIChatCompletionClient(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=INFO, max_retries=0, **kwargs
    )


def writer(model_client: Any) -> AssistantAgent:
    return AssistantAgent(
        "writer",
        model_client=model_client,
        tools=[add, explode],
        system_message="You are the writer.",
        reflect_on_tool_use=True,
    )


def check_tools(spans: list[agl.Span], first_server: agl.Span) -> None:
    asked = {c["function"]["name"]: c["id"] for c in first_server.output["tool_calls"]}
    tools = {s.name: s for s in spans if s.kind == "tool"}
    assert (
        tools["add"].status == "ok" and tools["add"].output == "5" and tools["add"].input == {"a": 2, "b": 3}
    )
    assert tools["explode"].status == "error" and "kaboom" in tools["explode"].error
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    assert {t.agent for t in tools.values()} == {"writer"}


#: what instrument() patches: (class, attribute)
PATCHED = [
    (BaseChatAgent, "run"),
    (BaseChatAgent, "run_stream"),
    (ChatAgentContainer, "handle_request"),
    (BaseGroupChat, "run_stream"),
]


def hooks() -> dict[str, Any]:
    """What of AutoGen instrument() changes: the patched methods, the event loggers' filters and levels."""
    loggers = [logging.getLogger(name) for name in (CORE_LOGGER, AGENTCHAT_LOGGER)]
    return {
        "methods": [cls.__dict__[attr] for cls, attr in PATCHED],
        "filters": [list(lg.filters) for lg in loggers],
        "levels": [lg.level for lg in loggers],
    }


def test_single_agent_zero_code_instrument(store, serve):
    tracer = agl.Tracer(store)
    server = serve(script, store)
    before = hooks()
    with agl_autogen.instrument() as handle:
        during = hooks()
        assert [a is b for a, b in zip(during["methods"], before["methods"], strict=True)] == [False] * 4
        assert [len(f) - len(g) for f, g in zip(during["filters"], before["filters"], strict=True)] == [1, 1]
        with tracer.rollout("2+3?") as ro:
            result = asyncio.run(writer(client(server.llm(ro.id))).run(task="2+3?"))
            ro.reward(1.0)
    assert not handle.active and hooks() == before
    assert result.messages[-1].content == "The sum is 5."
    spans = store.spans(ro.id)
    ours = [s for s in spans if s.attributes.get("agl.source") == "autogen"]
    (agent_span,) = [s for s in ours if s.kind == "agent"]
    assert agent_span.name == "writer" and agent_span.agent == "writer"
    assert all(s.parent_id == agent_span.span_id for s in ours if s is not agent_span)
    pairs = assert_joined(store, ro.id, "autogen")
    assert len(pairs) == 2 and {f.agent for f, _ in pairs} == {"writer"}
    assert all(f.attributes["agl.response_id"] == s.attributes["request_id"] for f, s in pairs)
    check_tools(spans, pairs[0][1])
    ts = assert_transitions_have_server_tokens(
        store, ro.id, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:explode", -0.5)]

    # uninstrumented: the agent runs (two model calls, on the server) and nothing of AutoGen's is recorded
    with tracer.rollout("again") as ro2:
        asyncio.run(writer(client(server.llm(ro2.id))).run(task="2+3?"))
    assert [s.attributes.get("server") for s in store.spans(ro2.id)] == ["agl"] * 2


def test_uninstrument_after_two_instruments_restores_autogen(store, serve):
    """Each instrument() wraps what the one before installed: uninstrument() undoes the latest first,
    so that AutoGen's methods and its loggers' levels end as they were before the first."""
    tracer = agl.Tracer(store)
    server = serve(script, store)
    before = hooks()
    first, second = agl_autogen.instrument(), agl_autogen.instrument()
    assert hooks()["methods"] != before["methods"]
    agl_autogen.uninstrument()
    assert not first.active and not second.active
    assert hooks() == before
    with tracer.rollout("again") as ro:
        asyncio.run(writer(client(server.llm(ro.id))).run(task="2+3?"))
    assert [s.attributes.get("server") for s in store.spans(ro.id)] == ["agl"] * 2


def test_two_instrumentations_each_record_and_come_off_in_any_order(store, serve):
    """Two instrument() calls into two stores: each records the run whole (agent, LLM calls from the
    INFO log, tools from the DEBUG log); the first removed while the second stays, the second goes on
    recording and the first records nothing; the last removed, AutoGen is as it was."""
    server = serve(script, store)
    before = hooks()
    stores = [agl.MemoryStore(), agl.MemoryStore()]
    first, second = agl_autogen.instrument(stores[0]), agl_autogen.instrument(stores[1])

    seen: set[str] = set()

    def run() -> list[list[tuple[str, str]]]:
        """The autogen spans each store gained from one run of the agent."""
        asyncio.run(writer(client(server.llm())).run(task="2+3?"))
        got = []
        for st in stores:
            spans = [s for ro in st.rollouts() for s in st.spans(ro.rollout_id) if s.span_id not in seen]
            seen.update(s.span_id for s in spans)
            ours = [s for s in spans if s.attributes.get("agl.source") == "autogen"]
            agents = [s.span_id for s in ours if s.kind == "agent"]
            assert all(s.parent_id in agents for s in ours if s.kind != "agent")  # under its own agent span
            got.append(sorted((s.kind, s.name) for s in ours))
        return got

    whole = [("agent", "writer"), ("llm", "llm"), ("llm", "llm"), ("tool", "add"), ("tool", "explode")]
    a, b = run()
    assert [k for k, _ in a] == [k for k, _ in b] == [k for k, _ in whole], (a, b)
    assert {n for k, n in a if k != "llm"} == {n for k, n in b if k != "llm"} == {"writer", "add", "explode"}
    first.uninstrument()  # the one the other was installed over
    assert not first.active and second.active
    a, b = run()
    assert a == [] and [k for k, _ in b] == [k for k, _ in whole]
    second.uninstrument()
    assert hooks() == before
    assert run() == [[], []]


def test_an_instrumentation_that_records_nothing_does_not_record_into_another(store, serve):
    """instrument() with no tracer and no rollout open records nothing; it must not hand its events to
    the other instrumentation, which records each LLM call and tool call once."""
    server = serve(script, store)
    other = agl.MemoryStore()
    agl_autogen.instrument()
    agl_autogen.instrument(other)
    asyncio.run(writer(client(server.llm())).run(task="2+3?"))
    spans = [s for ro in other.rollouts() for s in other.spans(ro.rollout_id)]
    kinds = sorted(s.kind for s in spans if s.attributes.get("agl.source") == "autogen")
    assert kinds == ["agent", "llm", "llm", "tool", "tool"]
    assert all(s.end_time is not None for s in spans)


def test_instrumenting_the_same_destination_twice_records_once(store, serve):
    """instrument() again for the same destination (a library and the user both call it) shares the
    installation: each call is recorded once; it stays until the last handle is removed."""
    tracer = agl.Tracer(store)
    server = serve(script, store)
    before = hooks()
    first, second = agl_autogen.instrument(), agl_autogen.instrument()

    def kinds() -> list[str]:
        with tracer.rollout("2+3?") as ro:
            asyncio.run(writer(client(server.llm(ro.id))).run(task="2+3?"))
        ours = [s for s in store.spans(ro.id) if s.attributes.get("agl.source") == "autogen"]
        return sorted(s.kind for s in ours)

    assert kinds() == ["agent", "llm", "llm", "tool", "tool"]
    first.uninstrument()
    assert not first.active and second.active
    assert kinds() == ["agent", "llm", "llm", "tool", "tool"]
    second.uninstrument()
    assert hooks() == before and kinds() == []


def test_team_with_model_client_wrapper_and_instrument(store, serve):
    tracer = agl.Tracer(store)
    server = serve(script, store)
    with agl_autogen.instrument(), tracer.rollout("2+3?") as ro:
        llm = server.llm(ro.id)
        checker = AssistantAgent(
            "checker", model_client=LightningModelClient(client(llm)), system_message="You are the checker."
        )
        team = RoundRobinGroupChat(
            [writer(LightningModelClient(client(llm))), checker],
            termination_condition=MaxMessageTermination(3),
        )
        result = asyncio.run(team.run(task="2+3?"))
    assert [m.content for m in result.messages][-2:] == ["The sum is 5.", "LGTM"]
    spans = store.spans(ro.id)
    ours = [s for s in spans if s.attributes.get("agl.source") == "autogen"]
    team_span = ours[0]
    assert team_span.kind == "chain" and team_span.name == "RoundRobinGroupChat"
    turns = [s for s in ours if s.kind == "agent"]
    assert [(s.name, s.parent_id) for s in turns] == [
        ("writer", team_span.span_id),
        ("checker", team_span.span_id),
    ]
    pairs = assert_joined(store, ro.id, "autogen")
    assert [f.agent for f, _ in pairs] == ["writer", "writer", "checker"]
    # the wrapper timed each call: the server span lies inside it; the log added the response id
    for f, s in pairs:
        assert f.start_time <= s.start_time and s.end_time <= f.end_time
        assert (
            "agl.timing" not in f.attributes and f.attributes["agl.response_id"] == s.attributes["request_id"]
        )
    check_tools(spans, pairs[0][1])
    ts = assert_transitions_have_server_tokens(store, ro.id, agents=["checker"])
    assert [t.response["content"] for t in ts] == ["LGTM"]


def selector_script(messages: list[dict[str, Any]]) -> Any:
    """The team's speaker selection picks the writer, then (once it has answered) the checker."""
    text = " ".join(str(m.get("content")) for m in messages)
    if "select the next role" in text:
        return "checker" if "The sum is 5." in text else "writer"
    return script(messages)


@pytest.mark.parametrize("wrapped", [False, True], ids=["event_log", "model_client_wrapper"])
def test_selector_group_chat_speaker_selection_is_named_after_its_manager(store, serve, wrapped):
    tracer = agl.Tracer(store)
    server = serve(selector_script, store)

    def model(llm: agl.LLM) -> Any:
        return LightningModelClient(client(llm)) if wrapped else client(llm)

    with agl_autogen.instrument(), tracer.rollout("2+3?") as ro:
        llm = server.llm(ro.id)
        checker = AssistantAgent("checker", model_client=model(llm), system_message="You are the checker.")
        team = SelectorGroupChat(
            [writer(model(llm)), checker],
            model_client=model(llm),
            termination_condition=MaxMessageTermination(3),
            allow_repeated_speaker=True,
            emit_team_events=True,
        )
        result = asyncio.run(team.run(task="2+3?"))
    selections = [m for m in result.messages if isinstance(m, SelectSpeakerEvent)]
    assert [m.content for m in selections] == [["writer"], ["checker"]]
    manager = selections[0].source  # the framework's own name of the speaker-selecting manager
    assert manager == "SelectorGroupChatManager"
    pairs = assert_joined(store, ro.id, "autogen")
    assert [f.agent for f, _ in pairs] == [manager, "writer", "writer", manager, "checker"]
    (team_span,) = [s for s in store.spans(ro.id) if s.kind == "chain"]
    assert team_span.name == "SelectorGroupChat" and team_span.agent is None
    assert all(f.parent_id == team_span.span_id for f, _ in pairs if f.agent == manager)
    ts = assert_transitions_have_server_tokens(store, ro.id, agents=[manager])
    assert [t.response["content"] for t in ts] == ["writer", "checker"]
    # a model client wrapper given a name keeps it (two selector teams told apart)
    if wrapped:
        with agl_autogen.instrument(), tracer.rollout("2+3?") as ro2:
            llm = server.llm(ro2.id)
            team = SelectorGroupChat(
                [writer(client(llm)), AssistantAgent("checker", model_client=client(llm))],
                model_client=LightningModelClient(client(llm), agent="router"),
                termination_condition=MaxMessageTermination(2),
            )
            asyncio.run(team.run(task="2+3?"))
        pairs = assert_joined(store, ro2.id, "autogen")
        assert [f.agent for f, _ in pairs] == ["router", "writer", "writer"]


def test_explicit_event_handler_and_wrapper_without_instrument(store, serve):
    """The explicit objects alone: the wrapper names the agent, the handler records tools."""
    tracer = agl.Tracer(store)
    server = serve(script, store)
    handler = LightningEventHandler()
    lg = logging.getLogger(AGENTCHAT_LOGGER)
    old = lg.level
    lg.addHandler(handler)
    lg.setLevel(logging.DEBUG)
    try:
        with tracer.rollout("2+3?") as ro:
            agent = writer(LightningModelClient(client(server.llm(ro.id)), agent="writer"))
            asyncio.run(agent.run(task="2+3?"))
    finally:
        lg.removeHandler(handler)
        lg.setLevel(old)
    pairs = assert_joined(store, ro.id, "autogen")
    assert [f.agent for f, _ in pairs] == ["writer", "writer"]
    check_tools(store.spans(ro.id), pairs[0][1])
    assert_transitions_have_server_tokens(store, ro.id)


@pytest.mark.slow
def test_autogen_with_hf_engine(store, hf_engine):
    from agentlightning_lite.serving import PolicyServer

    tracer = agl.Tracer(store)
    with PolicyServer(hf_engine, store) as server, agl_autogen.instrument(), tracer.rollout("hi") as ro:
        agent = AssistantAgent(
            "greeter", model_client=client(server.llm(ro.id), max_tokens=4, temperature=0.0)
        )
        out = asyncio.run(agent.run(task="Say hi.")).messages[-1].content
    (pair,) = assert_joined(store, ro.id, "autogen")
    assert pair[0].output["content"] == out
    (t,) = assert_transitions_have_server_tokens(store, ro.id)
    assert t.agent == "greeter" and len(t.response_token_ids) <= 4
