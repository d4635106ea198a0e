"""CrewAI adapter against the real CrewAI 1.x and a real PolicyServer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("crewai")

from crewai import LLM, Agent, Crew, Process, Task
from crewai.tools import tool

import agentlightning_lite as agl
from agentlightning_lite.adapters import crewai as agl_crewai
from agentlightning_lite.adapters._common import message_dict
from agentlightning_lite.adapters.crewai import LightningListener

from .conftest import assert_joined, assert_transitions_have_server_tokens, called_tools, system_text


@pytest.fixture(autouse=True)
def isolated() -> Iterator[None]:
    yield
    agl_crewai.uninstrument()


@tool("add")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool("explode")
def explode(x: int) -> int:
    """A tool that always fails."""
    raise ValueError("kaboom")


def script(messages: list[dict[str, Any]]) -> Any:
    if "Checker" in system_text(messages):
        return "Final Answer: LGTM"
    if "add" in called_tools(messages):
        return "The sum is 5."
    return {
        "tool_calls": [
            {"name": "add", "arguments": {"a": 2, "b": 3}},
            {"name": "explode", "arguments": {"x": 1}},
        ]
    }


def crew(llm_ep: agl.LLM, **llm_kwargs: Any) -> Crew:
    llm = LLM(model="openai/" + llm_ep.model, base_url=llm_ep.base_url, api_key=llm_ep.api_key, **llm_kwargs)
    writer = Agent(
        role="Writer", goal="add numbers", backstory="A careful writer.", tools=[add, explode], llm=llm
    )
    checker = Agent(role="Checker", goal="check answers", backstory="A strict checker.", llm=llm)
    t1 = Task(description="What is 2+3?", expected_output="a number", agent=writer)
    t2 = Task(description="Check the answer.", expected_output="a verdict", agent=checker)
    return Crew(agents=[writer, checker], tasks=[t1, t2], process=Process.sequential)


def test_crew_two_agents_with_tools(store, serve):
    tracer = agl.Tracer(store)
    server = serve(script, store)
    listener = LightningListener()
    try:
        with tracer.rollout("2+3?") as ro:
            out = crew(server.llm(ro.id)).kickoff()
            listener.flush()
            ro.reward(1.0)
    finally:
        listener.close()
    assert out.raw == "LGTM"
    assert listener.recorder.open_count() == 0
    spans = store.spans(ro.id)
    ours = [s for s in spans if s.attributes.get("agl.source") == "crewai"]
    by_id = {s.span_id: s for s in spans}
    (root,) = [s for s in ours if s.parent_id is None]
    assert root.kind == "chain" and root.output == "LGTM"
    assert all(s.parent_id in by_id for s in ours if s is not root)  # a tree: no dangling parents
    agents = {s.name: s for s in ours if s.kind == "agent"}
    assert set(agents) == {"Writer", "Checker"}
    assert all(s.agent for s in ours if s is not root)
    pairs = assert_joined(store, ro.id, "crewai")
    assert [f.agent for f, _ in pairs] == ["Writer", "Writer", "Checker"]
    for f, _ in pairs:  # each LLM call hangs under its agent's span
        assert f.parent_id == agents[f.agent].span_id
    asked = {c["function"]["name"]: c["id"] for c in pairs[0][1].output["tool_calls"]}
    tools = {s.name: s for s in ours if s.kind == "tool"}
    assert tools["add"].status == "ok" and tools["add"].agent == "Writer" and "5" in str(tools["add"].output)
    assert tools["explode"].status == "error" and "kaboom" in tools["explode"].error
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    ts = assert_transitions_have_server_tokens(
        store, ro.id, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:explode", -0.5)]
    assert [t.agent for t in agl.transitions(store, rollout_ids=[ro.id], agents=["Checker"])] == ["Checker"]


def _bus_handlers_of(listener: LightningListener) -> list[Any]:
    """The handlers on CrewAI's event bus that are methods of ``listener``."""
    from crewai.events import crewai_event_bus

    registered = [*crewai_event_bus._sync_handlers.values(), *crewai_event_bus._async_handlers.values()]
    return [h for handlers in registered for h in handlers if getattr(h, "__self__", None) is listener]


def test_zero_code_instrument_and_uninstrument(store, serve):
    tracer = agl.Tracer(store)
    server = serve(script, store)
    with agl_crewai.instrument() as handle, tracer.rollout("2+3?") as ro:
        assert len(_bus_handlers_of(handle.handler)) == 15  # every event the listener records
        crew(server.llm(ro.id)).kickoff()
        handle.handler.flush()
    assert len(assert_joined(store, ro.id, "crewai")) == 3
    assert not handle.active and _bus_handlers_of(handle.handler) == []
    with tracer.rollout("again") as ro2:
        crew(server.llm(ro2.id)).kickoff()
        LightningListener.flush()
    # the crew ran (three model calls, on the server) and nothing of CrewAI's was recorded
    assert [s.attributes.get("server") for s in store.spans(ro2.id)] == ["agl"] * 3


def test_uninstrument_removes_every_listener_instrument_installed():
    first, second = agl_crewai.instrument(), agl_crewai.instrument()
    assert _bus_handlers_of(first.handler) and _bus_handlers_of(second.handler)
    agl_crewai.uninstrument()
    assert not first.active and not second.active
    assert _bus_handlers_of(first.handler) == [] and _bus_handlers_of(second.handler) == []


def test_tool_runs_whose_arguments_differ_from_the_call_get_the_first_call_of_their_name():
    """The tool call a tool span answers, when CrewAI ran the tool with arguments other than the
    model's (coerced, or reformatted): the first unanswered call of its name, as in every adapter.
    The listener used to accept such a call only if it was the last one its agent asked, which gave
    the Writer's ``add`` no id at all and swapped the Checker's two ``add`` ids."""

    def span(span_id: str, kind: str, agent: str, t: float, **kw: Any) -> agl.Span:
        attributes = {"agl.source": "crewai"}
        return agl.Span(
            span_id=span_id, rollout_id="r", parent_id="crew", kind=kind, agent=agent,
            start_time=t, end_time=t + 0.5, attributes=attributes, **kw,
        )  # fmt: skip

    def asked(*calls: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
        return message_dict("assistant", None, [{"id": i, "name": n, "args": a} for i, n, a in calls])

    crew_span = agl.Span(span_id="crew", rollout_id="r", kind="chain", start_time=0.0, end_time=20.0)
    spans = [
        crew_span,
        span(
            "w-llm", "llm", "Writer", 1.0, output=asked(("w1", "add", {"a": 2}), ("w2", "explode", {"x": 1}))
        ),
        span("w-add", "tool", "Writer", 2.0, name="add", input={"a": "2"}),
        span("w-explode", "tool", "Writer", 3.0, name="explode", input='{"x": 1}'),
        span("c-llm", "llm", "Checker", 4.0, output=asked(("c1", "add", {"a": 1}), ("c2", "add", {"a": 2}))),
        span("c-add-1", "tool", "Checker", 5.0, name="add", input="a=1"),
        span("c-add-2", "tool", "Checker", 6.0, name="add", input="a=2"),
    ]
    listener = LightningListener()
    try:
        fixed = listener._adopt_orphans(crew_span, spans)
    finally:
        listener.close()
    ids = {span_id: s.attributes["tool_call_id"] for span_id, s in fixed.items()}
    assert ids == {"w-add": "w1", "w-explode": "w2", "c-add-1": "c1", "c-add-2": "c2"}


def test_a_long_lived_listener_forgets_finished_crews(store, serve):
    """Nothing a crew leaves in the listener outlives it, recorded or not: memory stays flat."""
    tracer = agl.Tracer(store)
    server = serve(script, store)
    listener = LightningListener()
    try:
        for i in range(3):
            with tracer.rollout(f"q{i}") as ro:
                crew(server.llm(ro.id)).kickoff()
                listener.flush()
            assert len(assert_joined(store, ro.id, "crewai")) == 3
            assert listener._ids == {} and listener._early_ends == {}
        unrecorded = store.start_rollout("no rollout open").rollout_id
        with pytest.warns(RuntimeWarning, match="no rollout open"):
            crew(server.llm(unrecorded)).kickoff()
            listener.flush()
        assert all(s.attributes.get("server") == "agl" for s in store.spans(unrecorded))
        assert listener._ids == {} and listener._early_ends == {} and not listener._skipped
    finally:
        listener.close()


def _swap_end_before_start(events: list[tuple[Any, Any]], start: str, end: str) -> None:
    i = next(i for i, (_, e) in enumerate(events) if type(e).__name__ == start)
    j = next(j for j, (_, e) in enumerate(events) if type(e).__name__ == end and j > i)
    events.insert(i, events.pop(j))


def _crew_end_before_last_task_end(events: list[tuple[Any, Any]]) -> None:
    (k,) = [k for k, (_, e) in enumerate(events) if type(e).__name__ == "CrewKickoffCompletedEvent"]
    crew_end = events.pop(k)
    last_task = max(i for i, (_, e) in enumerate(events) if type(e).__name__ == "TaskCompletedEvent")
    events.insert(last_task - 1, crew_end)  # before the checker's agent and task end
    assert [type(e).__name__ for _, e in events[-3:]] == [
        "CrewKickoffCompletedEvent",
        "AgentExecutionCompletedEvent",
        "TaskCompletedEvent",
    ]


@pytest.mark.parametrize(
    "reorder",
    [
        _crew_end_before_last_task_end,
        lambda ev: _swap_end_before_start(ev, "LLMCallStartedEvent", "LLMCallCompletedEvent"),
        lambda ev: _swap_end_before_start(ev, "ToolUsageStartedEvent", "ToolUsageFinishedEvent"),
    ],
    ids=["crew-end-before-last-task-end", "llm-end-before-start", "tool-end-before-start"],
)
def test_out_of_order_handlers(store, serve, reorder):
    """CrewAI runs handlers in a thread pool, so they can run out of order: a crew's end before its
    last task's end, an end before its start. A real crew's events, replayed in such an order, give
    the same trace: the crew is finished (re-parenting, join) once its spans have ended."""
    from crewai.events import crewai_event_bus

    tracer = agl.Tracer(store)
    server = serve(script, store)
    probe = LightningListener()
    table = {event_type: handler.__name__ for event_type, handler in probe._registered}
    probe.close()
    seen: list[tuple[Any, Any]] = []

    def capture(source: Any, event: Any) -> None:
        seen.append((source, event))

    for event_type in table:
        crewai_event_bus.on(event_type)(capture)
    try:
        with tracer.rollout("2+3?") as ro:  # a real run, its events captured, no listener recording
            crew(server.llm(ro.id)).kickoff()
            crewai_event_bus.flush()
    finally:
        for event_type in table:
            crewai_event_bus.off(event_type, capture)
    events = sorted(seen, key=lambda se: se[1].emission_sequence)
    reorder(events)

    listener = LightningListener()
    listener.close()  # handlers called here, in that order, not by the bus
    with tracer.rollout(rollout_id=ro.id):
        for source, event in events:
            getattr(listener, table[type(event)])(source, event)
    ours = [s for s in store.spans(ro.id) if s.attributes.get("agl.source") == "crewai"]
    agents = {s.name: s for s in ours if s.kind == "agent"}
    pairs = assert_joined(store, ro.id, "crewai")
    assert [f.agent for f, _ in pairs] == ["Writer", "Writer", "Checker"]
    for f, _ in pairs:  # under its agent's span, not re-parented to the crew as an orphan
        assert f.parent_id == agents[f.agent].span_id
    tools = {s.name: s for s in ours if s.kind == "tool"}
    assert tools["add"].status == "ok" and tools["explode"].status == "error"
    asked = {c["function"]["name"]: c["id"] for c in pairs[0][1].output["tool_calls"]}
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    assert listener._finishing == {} and listener._closing == {} and listener._ids == {}
    assert listener._early_ends == {} and listener.recorder.open_count() == 0


@pytest.mark.slow
def test_crewai_with_hf_engine(store, hf_engine):
    from agentlightning_lite.serving import PolicyServer

    tracer = agl.Tracer(store)
    with PolicyServer(hf_engine, store) as server, agl_crewai.instrument() as h, tracer.rollout("hi") as ro:
        llm_ep = server.llm(ro.id)
        llm = LLM(
            model="openai/" + llm_ep.model,
            base_url=llm_ep.base_url,
            api_key=llm_ep.api_key,
            max_tokens=4,
            temperature=0.0,
        )
        greeter = Agent(role="Greeter", goal="greet", backstory="Friendly.", llm=llm, max_iter=1)
        Crew(
            agents=[greeter], tasks=[Task(description="Say hi.", expected_output="a greeting", agent=greeter)]
        ).kickoff()
        h.handler.flush()
    pairs = assert_joined(store, ro.id, "crewai")
    assert {f.agent for f, _ in pairs} == {"Greeter"}
    ts = assert_transitions_have_server_tokens(store, ro.id)
    assert all(t.agent == "Greeter" and len(t.response_token_ids) <= 4 for t in ts)
