"""LangChain / LangGraph adapter against the real frameworks and a real PolicyServer."""

from __future__ import annotations

import warnings
from typing import Any, TypedDict

import pytest

pytest.importorskip("langchain_openai")
pytest.importorskip("langgraph")

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import ToolException, tool
from langchain_core.tracers import context as lc_context
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph

import agentlightning_lite as agl
from agentlightning_lite.adapters import langchain as agl_langchain
from agentlightning_lite.adapters.langchain import LightningCallback

from .conftest import assert_joined, assert_transitions_have_server_tokens, called_tools, system_text


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def divide(a: int, b: int) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolException("division by zero")
    return a / b


divide.handle_tool_error = True  # the model gets the error back as a ToolMessage(status="error")


def tool_script(messages: list[dict[str, Any]]) -> Any:
    if "add" in called_tools(messages):
        return "2+3 is 5."
    return {
        "tool_calls": [
            {"name": "add", "arguments": {"a": 2, "b": 3}},
            {"name": "divide", "arguments": {"a": 1, "b": 0}},
        ]
    }


def chat(llm: agl.LLM, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0, **kwargs)


def run_tool_agent(model: Any, config: dict[str, Any]) -> str:
    bound = model.bind_tools([add, divide])
    messages: list[Any] = [HumanMessage("What is 2+3? Also 1/0.")]
    ai = bound.invoke(messages, config=config)
    messages.append(ai)
    for call in ai.tool_calls:
        messages.append({"add": add, "divide": divide}[call["name"]].invoke(call, config=config))
    return bound.invoke(messages, config=config).content


def test_single_agent_with_tools_explicit_callback(store, serve):
    tracer = agl.Tracer(store)
    server = serve(tool_script, store)
    cb = LightningCallback()
    with tracer.rollout("2+3?") as ro:
        answer = run_tool_agent(chat(server.llm(ro.id)), {"callbacks": [cb], "metadata": {"agent": "solver"}})
        ro.reward(1.0)
    assert answer == "2+3 is 5."
    assert cb.recorder.open_count() == 0
    spans = store.spans(ro.id)
    # every span the adapter made names the agent
    assert {s.agent for s in spans if s.attributes.get("agl.source") == "langchain"} == {"solver"}
    pairs = assert_joined(store, ro.id, "langchain")
    assert len(pairs) == 2
    first_server = pairs[0][1]
    asked = {c["function"]["name"]: c["id"] for c in first_server.output["tool_calls"]}
    tools = {s.name: s for s in spans if s.kind == "tool"}
    assert tools["add"].status == "ok" and tools["add"].output == "5"
    assert tools["add"].input == {"a": 2, "b": 3}
    assert tools["divide"].status == "error" and "division by zero" in tools["divide"].error
    assert tools["add"].attributes["tool_call_id"] == asked["add"]
    assert tools["divide"].attributes["tool_call_id"] == asked["divide"]
    ts = assert_transitions_have_server_tokens(
        store, ro.id, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert [t.agent for t in ts] == ["solver", "solver"]
    # the first call asked for both tools: +0.1 - 0.5, plus the final reward carried back
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:divide", -0.5)]


def test_writer_checker_rewriter_selects_agents(store, serve):
    def script(messages):
        sys = system_text(messages)
        if "the writer." in sys:
            return "Roses are red."
        if "checker" in sys:
            return "needs rhyme"
        return "Roses are red, violets are blue."

    tracer = agl.Tracer(store)
    server = serve(script, store)
    with tracer.rollout("write a poem") as ro:
        model = chat(server.llm(ro.id))

        def step(role: str) -> Any:
            prompt = ChatPromptTemplate.from_messages(
                [("system", f"You are the {role}."), ("user", "{text}")]
            )
            return prompt | model | StrOutputParser() | (lambda text: {"text": text})

        # the three ways to name an agent: run_name, metadata, run_name
        flow = (
            step("writer").with_config(run_name="writer")
            | step("checker").with_config(metadata={"agent": "checker"})
            | step("rewriter").with_config(run_name="rewriter")
        )
        out = flow.invoke({"text": "a poem"}, config={"callbacks": [LightningCallback()]})
        ro.reward(0.5)
    assert out == {"text": "Roses are red, violets are blue."}
    pairs = assert_joined(store, ro.id, "langchain")
    assert [f.agent for f, _ in pairs] == ["writer", "checker", "rewriter"]
    agent_spans = [s for s in store.spans(ro.id) if s.kind == "agent"]
    assert [(s.name, s.agent) for s in agent_spans] == [
        ("writer", "writer"),
        ("RunnableSequence", "checker"),
        ("rewriter", "rewriter"),
    ]
    ts = assert_transitions_have_server_tokens(store, ro.id, agents=["writer", "rewriter"])
    assert [t.agent for t in ts] == ["writer", "rewriter"]
    assert [t.response["content"] for t in ts] == ["Roses are red.", "Roses are red, violets are blue."]
    assert [t.index for t in ts] == [0, 2]
    assert all(t.reward == 0.5 for t in ts)


class _State(TypedDict):
    question: str
    plan: str
    answer: str


def configure_hooks_holding(handler: LightningCallback) -> int:
    """How many of LangChain's configure hooks hand ``handler`` to every run."""
    return sum(var.get() is handler for var, *_ in lc_context._configure_hooks if var.name.startswith("agl_"))


def test_langgraph_zero_code_instrument_and_uninstrument(store, serve):
    def script(messages):
        sys = system_text(messages)
        if "planner" in sys:
            return "Use the add tool."
        if "add" in called_tools(messages):
            return "5"
        return {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}

    tracer = agl.Tracer(store)
    server = serve(script, store)

    def build(llm: agl.LLM) -> Any:
        model = chat(llm)

        def planner(state: _State) -> dict[str, str]:
            reply = model.invoke([SystemMessage("You are the planner."), HumanMessage(state["question"])])
            return {"plan": reply.content}

        def solver(state: _State) -> dict[str, str]:
            bound = model.bind_tools([add])
            msgs: list[Any] = [SystemMessage("You are the solver."), HumanMessage(state["plan"])]
            ai = bound.invoke(msgs)
            msgs.append(ai)
            msgs += [add.invoke(c) for c in ai.tool_calls]
            return {"answer": bound.invoke(msgs).content}

        g = StateGraph(_State)
        g.add_node("planner", planner)
        g.add_node("solver", solver)
        g.add_edge(START, "planner")
        g.add_edge("planner", "solver")
        g.add_edge("solver", END)
        return g.compile()

    with agl_langchain.instrument() as handle:
        assert handle.active and configure_hooks_holding(handle.handler) == 1
        with tracer.rollout("2+3?") as ro:
            result = build(server.llm(ro.id)).invoke({"question": "2+3?", "plan": "", "answer": ""})
    assert result["answer"] == "5"
    assert not handle.active
    spans = store.spans(ro.id)
    by_id = {s.span_id: s for s in spans}
    pairs = assert_joined(store, ro.id, "langchain")
    assert [f.agent for f, _ in pairs] == ["planner", "solver", "solver"]
    nodes = {s.name: s for s in spans if s.kind == "agent"}
    assert set(nodes) == {"planner", "solver"}
    graph = by_id[nodes["planner"].parent_id]
    assert graph.name == "LangGraph" and graph.parent_id is None
    for f, _ in pairs:  # each LLM call hangs under its node's agent span
        assert f.parent_id == nodes[f.agent].span_id
    (tool_span,) = [s for s in spans if s.kind == "tool"]
    assert (
        tool_span.agent == "solver"
        and tool_span.output == "5"
        and tool_span.parent_id == nodes["solver"].span_id
    )
    assert_transitions_have_server_tokens(store, ro.id)

    # after uninstrument() the hook is gone and nothing is recorded any more
    assert configure_hooks_holding(handle.handler) == 0
    with tracer.rollout("again") as ro2:
        build(server.llm(ro2.id)).invoke({"question": "2+3?", "plan": "", "answer": ""})
    assert [s.attributes.get("agl.source") for s in store.spans(ro2.id)] == [None] * 3


class _Samples(TypedDict):
    question: str
    samples: list[str]
    verdict: str


def test_n_choices_all_get_the_agent_and_parent_of_their_request(store, serve):
    """ChatOpenAI(n=2) in one LangGraph node: both choices of the request are that node's calls."""
    tracer = agl.Tracer(store)
    server = serve(["4", "four", "both right"], store)  # sampler's two choices, then the judge

    def build(llm: agl.LLM) -> Any:
        sampler_model, judge_model = chat(llm, n=2), chat(llm)

        def sampler(state: _Samples, config: RunnableConfig) -> dict[str, Any]:
            # generate() returns every choice; it takes the node's callbacks (not its context) explicitly
            result = sampler_model.generate(
                [[HumanMessage(state["question"])]], callbacks=config["callbacks"]
            )
            return {"samples": [g.text for g in result.generations[0]]}

        def judge(state: _Samples) -> dict[str, str]:
            return {"verdict": judge_model.invoke(" or ".join(state["samples"])).content}

        g = StateGraph(_Samples)
        g.add_node("sampler", sampler)
        g.add_node("judge", judge)
        g.add_edge(START, "sampler")
        g.add_edge("sampler", "judge")
        g.add_edge("judge", END)
        return g.compile()

    with agl_langchain.instrument(), tracer.rollout("2+2?") as ro:
        result = build(server.llm(ro.id)).invoke({"question": "2+2?", "samples": [], "verdict": ""})
        ro.reward(1.0)
    assert result["samples"] == ["4", "four"] and result["verdict"] == "both right"
    spans = store.spans(ro.id)
    servers = [s for s in spans if s.attributes.get("server") == "agl"]
    assert [(s.output["content"], s.attributes["choice_index"]) for s in servers] == [
        ("4", 0),
        ("four", 1),
        ("both right", 0),
    ]
    fw = {f.agent: f for f in spans if f.kind == "llm" and f.attributes.get("agl.source") == "langchain"}
    assert set(fw) == {"sampler", "judge"}
    assert fw["sampler"].attributes["agl.duplicate_of"] == servers[0].span_id
    for s, agent in zip(servers, ["sampler", "sampler", "judge"], strict=True):
        assert s.agent == agent
        assert s.parent_id == fw[agent].span_id and s.attributes["agl.framework_span_id"] == fw[agent].span_id
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ts = assert_transitions_have_server_tokens(store, ro.id, agents=["sampler"])
    assert [t.response["content"] for t in ts] == ["4", "four"] and {t.agent for t in ts} == {"sampler"}
    assert [t.metadata["span_id"] for t in ts] == [s.span_id for s in servers[:2]]


def test_model_not_ours_is_recorded_without_tokens_and_skipped_with_warning(store, foreign_endpoint):
    """An agent on another OpenAI-compatible endpoint: spans recorded, marked, and not trained on."""

    def answer(path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path.endswith("/chat/completions") and body["model"] == "gpt-other"
        return {
            "id": "chatcmpl-elsewhere",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-other",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
        }

    tracer = agl.Tracer(store)
    model = ChatOpenAI(base_url=foreign_endpoint(answer), api_key="k", model="gpt-other", max_retries=0)
    with tracer.rollout("2+2?") as ro:
        assert (
            model.invoke("2+2?", config={"callbacks": [LightningCallback()], "run_name": "solo"}).content
            == "4"
        )
    (span,) = store.spans(ro.id)
    assert span.kind == "llm" and span.agent == "solo" and span.output["content"] == "4"
    assert span.attributes["agl.has_tokens"] is False
    assert span.attributes["agl.response_id"] == "chatcmpl-elsewhere"
    with pytest.warns(
        RuntimeWarning, match=r"1 LLM call\(s\) recorded by framework adapters \(1 from langchain\)"
    ):
        assert agl.transitions(store) == []


@pytest.mark.slow
def test_langchain_with_hf_engine(store, hf_engine):
    from agentlightning_lite.serving import PolicyServer

    tracer = agl.Tracer(store)
    with PolicyServer(hf_engine, store) as server, tracer.rollout("hi") as ro:
        model = chat(server.llm(ro.id), max_tokens=4, temperature=0)
        reply = model.invoke(
            "Say hi.", config={"callbacks": [LightningCallback()], "metadata": {"agent": "greeter"}}
        )
    (pair,) = assert_joined(store, ro.id, "langchain")
    assert pair[0].output["content"] == reply.content
    assert len(pair[1].response_token_ids) <= 4
    (t,) = assert_transitions_have_server_tokens(store, ro.id)
    assert t.agent == "greeter"
