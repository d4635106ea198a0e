"""MCP adapter: tool calls to a real MCP server over stdio, from a plain ``mcp`` client and from agent
frameworks, recorded as ``tool`` spans (the server is a python file written here, run as a subprocess)."""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata
import json
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

from mcp import ClientSession, StdioServerParameters, stdio_client

import agentlightning_lite as agl
from agentlightning_lite.adapters import Recorder
from agentlightning_lite.adapters import mcp as agl_mcp

from .conftest import called_tools

MCP2 = int(importlib.metadata.version("mcp").split(".")[0]) >= 2

# a calculator MCP server: `add` succeeds, `divide` by zero fails (an isError result), `wait` outlasts
# the client's read timeout (an exception in the client)
SERVER = '''
import asyncio
try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError:  # mcp 1.x
    from mcp.server.fastmcp import FastMCP as MCPServer
    from mcp.server.fastmcp.exceptions import ToolError

server = MCPServer("calc")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ToolError("division by zero")
    return a / b


@server.tool()
async def wait(seconds: float) -> str:
    """Wait, then say so."""
    await asyncio.sleep(seconds)
    return "done"


if __name__ == "__main__":
    server.run("stdio")
'''

DIVIDE_ERROR = "Error executing tool divide: division by zero"
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": props}}}
    for name, props in [
        ("add", {"a": {"type": "integer"}, "b": {"type": "integer"}}),
        ("divide", {"a": {"type": "number"}, "b": {"type": "number"}}),
    ]
]


@pytest.fixture
def server_params(tmp_path: Path) -> StdioServerParameters:
    path = tmp_path / "calc_server.py"
    path.write_text(SERVER)
    return StdioServerParameters(command=sys.executable, args=[str(path)])


@pytest.fixture(autouse=True)
def clean_instrumentation() -> Iterator[None]:
    yield
    agl_mcp.uninstrument()
    assert not hasattr(ClientSession.call_tool, "__agl_wrapped__")


def short_timeout() -> Any:
    return 0.3 if MCP2 else datetime.timedelta(seconds=0.3)  # mcp 1.x takes a timedelta


def tool_spans(store: agl.Store, rollout_id: str) -> dict[str, agl.Span]:
    spans = [s for s in store.spans(rollout_id) if s.kind == "tool"]
    by_name = {s.name: s for s in spans}
    assert len(by_name) == len(spans), [s.name for s in spans]  # each tool once
    return by_name


def calc_script(messages: list[dict[str, Any]]) -> Any:
    if "add" in called_tools(messages):
        return "2 + 3 = 5; 1 / 0 is undefined."
    return {
        "tool_calls": [
            {"name": "add", "arguments": {"a": 2, "b": 3}},
            {"name": "divide", "arguments": {"a": 1, "b": 0}},
        ]
    }


@pytest.mark.slow  # starts an MCP server process (about 2 s on the 2-core machine)
def test_plain_client_calls_are_tool_spans_in_sqlite(tmp_path, server_params, serve):
    store = agl.SQLiteStore(tmp_path / "runs.db")
    tracer = agl.Tracer(store)
    server = serve(calc_script, store)
    agl_mcp.instrument()

    async def agent(ro: Any) -> None:
        llm = server.llm(ro.id)
        question = [{"role": "user", "content": "2+3, 1/0?"}]
        reply = llm.openai_client().chat.completions.create(model=llm.model, messages=question, tools=TOOLS)
        asked = reply.choices[0].message.tool_calls
        async with stdio_client(server_params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with tracer.span("agent", "solver", agent="solver"):
                for call in asked:
                    await session.call_tool(call.function.name, json.loads(call.function.arguments))
                # the server is still waiting when the session closes: its late reply cannot race the
                # shutdown (mcp 1.x fails the session's task group with BrokenResourceError then)
                with pytest.raises(Exception, match=r"(?i)timed out"):
                    await session.call_tool("wait", {"seconds": 30}, read_timeout_seconds=short_timeout())

    with tracer.rollout("2+3, 1/0?") as ro:
        asyncio.run(agent(ro))
        ro.reward(1.0)
    store.close()

    store = agl.SQLiteStore(tmp_path / "runs.db")  # what was written, read back from the file
    spans = store.spans(ro.id)
    (solver,) = [s for s in spans if s.kind == "agent"]
    tools = tool_spans(store, ro.id)
    assert list(tools) == ["add", "divide", "wait"]
    add, divide, wait = tools["add"], tools["divide"], tools["wait"]
    assert (add.status, add.input, add.output, add.error) == ("ok", {"a": 2, "b": 3}, {"result": 5}, None)
    assert (divide.status, divide.input, divide.output) == ("error", {"a": 1, "b": 0}, DIVIDE_ERROR)
    assert divide.error == DIVIDE_ERROR
    assert [add.attributes["mcp.is_error"], divide.attributes["mcp.is_error"]] == [False, True]
    assert wait.status == "error" and "timed out" in wait.error.lower() and wait.input == {"seconds": 30}
    assert wait.error.startswith("McpError" if not MCP2 else "MCPError")
    for t in tools.values():
        assert t.parent_id == solver.span_id and t.agent == "solver"
        assert t.attributes["agl.source"] == "mcp"
        assert t.attributes.get("mcp.server") == ("calc" if MCP2 else None)  # mcp 1.x keeps no server info
    # AIR: the LLM call that asked for the tools gets the tools' outcomes
    (t,) = agl.transitions(
        store, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(success=0.1, error=-0.5)]
    )
    assert t.metadata["intermediate_rewards"] == [
        ("tool_ok:add", 0.1),
        ("tool_error:divide", -0.5),
        ("tool_error:wait", -0.5),
    ]
    assert t.reward == pytest.approx(1.0 + 0.1 - 0.5 - 0.5)
    store.close()


@pytest.mark.slow  # starts an MCP server process
def test_instrument_once_per_destination_undo_and_no_rollout(server_params):
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    original = ClientSession.call_tool
    first, second = agl_mcp.instrument(), agl_mcp.instrument()  # a library and the user, say
    wrapped = ClientSession.call_tool
    assert wrapped is not original and wrapped.__agl_wrapped__ is original

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with stdio_client(server_params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with tracer.rollout("twice") as ro:
                await session.call_tool("add", {"a": 1, "b": 1})
            out["twice"] = ro.id
            first.uninstrument()
            assert ClientSession.call_tool is wrapped  # the other instrumentation still records
            with tracer.rollout("once") as ro:
                await session.call_tool("add", {"a": 1, "b": 2})
            out["once"] = ro.id
            # a framework's tool span open (with a server prefix in its name): the calls complete it, a
            # failed call and then its retry, which succeeds
            recorder = Recorder("framework")
            with tracer.rollout("retried") as ro:
                recorder.start("run-1", "tool", "calc_divide", input={"a": 1, "b": 1})
                failed = await session.call_tool("divide", {"a": 1, "b": 0})
                handle = recorder.get("run-1")
                assert handle is not None
                out["failed_status"] = handle.status, handle.error, store.spans(ro.id), failed
                await session.call_tool("divide", {"a": 1, "b": 1})
                recorder.end("run-1", output="1.0")
            out["retried"] = ro.id
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = await session.call_tool("add", {"a": 2, "b": 2})  # no rollout open
            out["warnings"] = [str(w.message) for w in caught]
            out["outside"] = result
            second.uninstrument()
            assert ClientSession.call_tool is original
            with tracer.rollout("after") as ro:
                await session.call_tool("add", {"a": 3, "b": 3})
            out["after"] = ro.id
            # a tracer given: recorded into an implicit rollout of its store when none of its is open
            with agl_mcp.instrument(store):
                await session.call_tool("divide", {"a": 1, "b": 0})
        return out

    out = asyncio.run(run())
    assert [s.input for s in store.spans(out["twice"])] == [{"a": 1, "b": 1}]  # once, not twice
    assert [s.output for s in store.spans(out["once"])] == [{"result": 3}]
    assert out["failed_status"] == ("error", DIVIDE_ERROR, [], out["failed_status"][3])  # not written yet
    assert agl_mcp.is_error(out["failed_status"][3])
    (retried,) = store.spans(out["retried"])
    assert (retried.name, retried.status, retried.error, retried.output) == ("calc_divide", "ok", None, "1.0")
    assert retried.attributes["agl.source"] == "framework"
    assert (retried.attributes["mcp.calls"], retried.attributes["mcp.is_error"]) == (2, False)
    assert agl_mcp.is_error(out["outside"]) is False
    (warned,) = out["warnings"]
    assert "no rollout is open" in warned
    assert store.spans(out["after"]) == []
    implicit = [r for r in store.rollouts() if r.rollout_id not in out.values()]
    (ro,) = implicit
    (span,) = store.spans(ro.rollout_id)
    assert (span.name, span.status, span.error) == ("divide", "error", DIVIDE_ERROR)
    assert ro.status == "failed"


@pytest.mark.slow  # starts an MCP server process
@pytest.mark.skipif(not MCP2, reason="mcp.Client is mcp 2.x's")
def test_high_level_client_call_is_one_span(server_params):
    from mcp import Client

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    agl_mcp.instrument()

    async def run() -> str:
        async with Client(server_params) as client:
            with tracer.rollout("q") as ro:
                result = await client.call_tool("add", {"a": 2, "b": 5})
                assert not agl_mcp.is_error(result)
        return ro.id

    rid = asyncio.run(run())
    (span,) = store.spans(rid)  # Client.call_tool's session call is not a second span
    assert (span.name, span.output, span.attributes["mcp.server"]) == ("add", {"result": 7}, "calc")


# -- the OpenAI Agents SDK's MCP servers --------------------------------------------------------------


@pytest.fixture
def sdk_processors() -> Iterator[Any]:
    """No SDK exporter (it would try to reach OpenAI); the registry restored after the test."""
    agents_tracing = pytest.importorskip("agents.tracing")
    from agentlightning_lite.adapters import openai_agents as agl_agents

    multi = agents_tracing.get_trace_provider()._multi_processor
    before = multi._processors
    agents_tracing.set_trace_processors([])
    yield agents_tracing.set_trace_processors
    agl_agents.uninstrument()
    agents_tracing.set_trace_processors(list(before))


def run_sdk_agent(server_params: StdioServerParameters, llm: agl.LLM) -> Any:
    """An Agents SDK agent with the calculator as an MCP server (stdio), its model on the PolicyServer."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner
    from agents.mcp import MCPServerStdio
    from openai import AsyncOpenAI

    async def run() -> Any:
        params = {"command": server_params.command, "args": list(server_params.args)}
        async with MCPServerStdio(params=params, name="calc", client_session_timeout_seconds=30) as calc:
            client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
            agent = Agent(
                name="math",
                instructions="You do math with the calculator's tools.",
                mcp_servers=[calc],
                model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
            )
            return await Runner.run(agent, "2+3, 1/0?")

    return asyncio.run(run())


@pytest.mark.slow  # starts an MCP server process and runs an agent
def test_agents_sdk_mcp_server_alone(store, serve, server_params, sdk_processors):
    """No Agents SDK processor: the MCP layer alone records the agent's MCP tool calls."""
    tracer = agl.Tracer(store)
    server = serve(calc_script, store)
    agl_mcp.instrument()
    with tracer.rollout("2+3, 1/0?") as ro:
        result = run_sdk_agent(server_params, server.llm(ro.id))
        ro.reward(1.0)
    assert result.final_output == "2 + 3 = 5; 1 / 0 is undefined."
    tools = tool_spans(store, ro.id)
    assert set(tools) == {"add", "divide"}
    assert {s.attributes["agl.source"] for s in tools.values()} == {"mcp"}
    assert (tools["add"].status, tools["add"].input, tools["add"].output) == (
        "ok",
        {"a": 2, "b": 3},
        {"result": 5},
    )
    assert (tools["divide"].status, tools["divide"].error) == ("error", DIVIDE_ERROR)
    (t,) = agl.transitions(store, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(0.1, -0.5)])[:1]
    assert sorted(t.metadata["intermediate_rewards"]) == [("tool_error:divide", -0.5), ("tool_ok:add", 0.1)]


@pytest.mark.slow  # starts an MCP server process and runs an agent
def test_agents_sdk_processor_and_mcp_record_each_call_once(store, serve, server_params, sdk_processors):
    """The Agents SDK processor and the MCP layer both on: one ``tool`` span per call, the SDK's (with its
    agent and ``tool_call_id``), failed by the MCP ``isError`` result that the SDK alone records as ok."""
    from agentlightning_lite.adapters import openai_agents as agl_agents

    tracer = agl.Tracer(store)
    server = serve(calc_script, store)
    agl_agents.instrument()
    agl_mcp.instrument()
    with tracer.rollout("2+3, 1/0?") as ro:
        result = run_sdk_agent(server_params, server.llm(ro.id))
        ro.reward(1.0)
    assert result.final_output == "2 + 3 = 5; 1 / 0 is undefined."
    tools = tool_spans(store, ro.id)  # each tool once
    assert set(tools) == {"add", "divide"}
    add, divide = tools["add"], tools["divide"]
    assert {s.attributes["agl.source"] for s in tools.values()} == {"openai_agents"}
    assert {s.agent for s in tools.values()} == {"math"}
    assert add.status == "ok" and add.input == {"a": 2, "b": 3} and add.attributes["mcp.is_error"] is False
    assert divide.status == "error" and divide.error == DIVIDE_ERROR and divide.attributes["mcp.is_error"]
    assert add.attributes["mcp.calls"] == divide.attributes["mcp.calls"] == 1
    llm_spans = [s for s in store.spans(ro.id) if s.attributes.get("server") == "agl"]
    asked = {c["function"]["name"]: c["id"] for c in llm_spans[0].output["tool_calls"]}
    assert {n: t.attributes["tool_call_id"] for n, t in tools.items()} == asked
    ts = agl.transitions(store, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(0.1, -0.5)])
    assert sorted(ts[0].metadata["intermediate_rewards"]) == [
        ("tool_error:divide", -0.5),
        ("tool_ok:add", 0.1),
    ]

    # the SDK's processor alone: the same isError result is an ok tool span (what the MCP layer adds)
    agl_mcp.uninstrument()
    with tracer.rollout("again") as ro2:
        run_sdk_agent(server_params, server.llm(ro2.id))
    again = tool_spans(store, ro2.id)
    assert again["divide"].status == "ok" and "mcp.is_error" not in again["divide"].attributes


# -- LangChain's MCP adapters (langchain-mcp-adapters 0.3.2 requires mcp<2; 0.3.1 fails to import on mcp 2) --


@pytest.mark.slow  # starts an MCP server process
def test_langchain_mcp_adapters_with_callback_record_each_call_once(store, serve, server_params):
    pytest.importorskip("langchain_mcp_adapters.tools", exc_type=ImportError)
    from langchain_core.messages import HumanMessage
    from langchain_mcp_adapters.tools import load_mcp_tools
    from langchain_openai import ChatOpenAI

    from agentlightning_lite.adapters.langchain import LightningCallback

    tracer = agl.Tracer(store)
    server = serve(calc_script, store)
    agl_mcp.instrument()
    callback = LightningCallback()

    async def run(llm: agl.LLM) -> list[Any]:
        config: Any = {"callbacks": [callback], "metadata": {"agent": "solver"}}
        model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
        async with stdio_client(server_params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            tools = {t.name: t for t in await load_mcp_tools(session)}
            ai = await model.bind_tools(list(tools.values())).ainvoke(
                [HumanMessage("2+3, 1/0?")], config=config
            )
            return [await tools[call["name"]].ainvoke(call, config=config) for call in ai.tool_calls]

    with tracer.rollout("2+3, 1/0?") as ro:
        replies = asyncio.run(run(server.llm(ro.id)))
        ro.reward(1.0)
    assert [m.status for m in replies] == ["success", "error"]  # ToolMessages back to the model
    tools = tool_spans(store, ro.id)  # each tool once: LangChain's span, completed by the MCP call
    assert set(tools) == {"add", "divide"}
    assert {s.attributes["agl.source"] for s in tools.values()} == {"langchain"}
    assert {s.agent for s in tools.values()} == {"solver"}
    assert tools["add"].status == "ok" and tools["add"].attributes["mcp.is_error"] is False
    assert tools["divide"].status == "error" and tools["divide"].attributes["mcp.is_error"] is True
    assert "division by zero" in tools["divide"].error
    ts = agl.transitions(store, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(0.1, -0.5)])
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:add", 0.1), ("tool_error:divide", -0.5)]


# -- AutoGen AgentChat's MCP workbench ------------------------------------------------------------------


@pytest.mark.slow  # starts an MCP server process and runs an agent
def test_autogen_mcp_workbench_with_instrument_record_each_call_once(store, serve, server_params):
    pytest.importorskip("autogen_ext.tools.mcp", exc_type=ImportError)
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient
    from autogen_ext.tools.mcp import McpWorkbench, StdioServerParams

    from agentlightning_lite.adapters import autogen as agl_autogen

    info: Any = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown"}
    info["structured_output"] = False
    tracer = agl.Tracer(store)
    server = serve(calc_script, store)

    async def run(llm: agl.LLM) -> Any:
        params = StdioServerParams(command=server_params.command, args=list(server_params.args))
        async with McpWorkbench(params) as calc:
            model = OpenAIChatCompletionClient(
                model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info, max_retries=0
            )
            agent = AssistantAgent("math", model_client=model, workbench=calc, reflect_on_tool_use=True)
            return await agent.run(task="2+3, 1/0?")

    with agl_autogen.instrument(), agl_mcp.instrument():
        with tracer.rollout("2+3, 1/0?") as ro:
            result = asyncio.run(run(server.llm(ro.id)))
            ro.reward(1.0)
    assert result.messages[-1].content == "2 + 3 = 5; 1 / 0 is undefined."
    tools = tool_spans(store, ro.id)  # each tool once: AutoGen's span, completed by the MCP call
    assert set(tools) == {"add", "divide"}
    assert {s.attributes["agl.source"] for s in tools.values()} == {"autogen"}
    assert {s.agent for s in tools.values()} == {"math"}
    assert tools["add"].status == "ok" and tools["add"].attributes["mcp.is_error"] is False
    assert tools["divide"].status == "error" and tools["divide"].attributes["mcp.is_error"] is True
