"""Adapter overhead: the same agent run with and without the framework adapter, per framework.

Each framework runs a single agent with one tool (two LLM calls and one tool call) against a
ScriptedEngine behind a real PolicyServer on 127.0.0.1. Every run opens a rollout (the server needs one
to route the calls); instrumented runs also record the framework's spans and join them with the server's
token-level spans. Instrumented and plain runs are paired, each pair in a random (seeded) order with a
garbage collection before every run, after a warm-up of each.

    python -m benchmarks.perf.bench_adapters                 # 100 runs each, writes adapters_results.md
    python -m benchmarks.perf.bench_adapters --runs 20 --frameworks langchain --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import os
import platform
import random
import statistics
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

HERE = Path(__file__).resolve().parent
TARGET = 0.05


def script(messages: list[dict[str, Any]]) -> Any:
    """Ask for the add tool once, then answer."""
    if any(m.get("role") == "tool" for m in messages):
        return "The sum is 5."
    return {"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}}]}


# -- one agent per framework: setup() -> (run(llm), instrument() -> handle) ------------------------
def langchain_case() -> tuple[Callable[[agl.LLM], Any], Callable[[], Any]]:
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from agentlightning_lite.adapters import langchain as adapter

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def run(llm: agl.LLM) -> Any:
        model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model).bind_tools([add])
        cfg = {"run_name": "solver"}
        msgs: list[Any] = [HumanMessage("2+3?")]
        ai = model.invoke(msgs, config=cfg)
        msgs += [ai, *(add.invoke(c, config=cfg) for c in ai.tool_calls)]
        return model.invoke(msgs, config=cfg).content

    return run, adapter.instrument


def openai_agents_case() -> tuple[Callable[[agl.LLM], Any], Callable[[], Any]]:
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_trace_processors
    from openai import AsyncOpenAI

    from agentlightning_lite.adapters import openai_agents as adapter

    set_trace_processors([])  # no exporter to OpenAI's backend on either side

    @function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def run(llm: agl.LLM) -> Any:
        async def go() -> Any:
            async with AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key) as client:
                model = OpenAIChatCompletionsModel(model=llm.model, openai_client=client)
                agent = Agent(name="solver", instructions="Solve.", tools=[add], model=model)
                return (await Runner.run(agent, "2+3?")).final_output

        return asyncio.run(go())

    return run, adapter.instrument


def autogen_case() -> tuple[Callable[[agl.LLM], Any], Callable[[], Any]]:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    from agentlightning_lite.adapters import autogen as adapter

    info = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "family": "unknown",
        "structured_output": False,
    }

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def run(llm: agl.LLM) -> Any:
        async def go() -> Any:
            client = OpenAIChatCompletionClient(
                model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info
            )
            agent = AssistantAgent("solver", model_client=client, tools=[add], reflect_on_tool_use=True)
            try:
                return (await agent.run(task="2+3?")).messages[-1].content
            finally:
                await client.close()

        return asyncio.run(go())

    return run, adapter.instrument


def crewai_case() -> tuple[Callable[[agl.LLM], Any], Callable[[], Any]]:
    from crewai import LLM, Agent, Crew, Task
    from crewai.events import crewai_event_bus
    from crewai.tools import tool

    from agentlightning_lite.adapters import crewai as adapter

    @tool("add")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    def run(llm_ep: agl.LLM) -> Any:
        llm = LLM(model="openai/" + llm_ep.model, base_url=llm_ep.base_url, api_key=llm_ep.api_key)
        solver = Agent(role="Solver", goal="add numbers", backstory="Careful.", tools=[add], llm=llm)
        task = Task(description="What is 2+3?", expected_output="a number", agent=solver)
        out = Crew(agents=[solver], tasks=[task]).kickoff().raw
        crewai_event_bus.flush()  # both sides wait for the bus's handlers (CrewAI's own listeners too)
        return out

    return run, adapter.instrument


CASES: dict[str, Callable[[], tuple[Callable[[agl.LLM], Any], Callable[[], Any]]]] = {
    "langchain": langchain_case,
    "openai_agents": openai_agents_case,
    "autogen": autogen_case,
    "crewai": crewai_case,
}


def bench(name: str, runs: int, warmup: int, store_kind: str) -> dict[str, Any]:
    """Time ``runs`` plain and ``runs`` instrumented runs of one framework, interleaved."""
    run, instrument = CASES[name]()
    store: agl.Store = (
        agl.MemoryStore() if store_kind == "memory" else agl.SQLiteStore(f"/tmp/agl_bench_{name}.db")
    )
    tracer = agl.Tracer(store)
    times: dict[bool, list[float]] = {False: [], True: []}
    with PolicyServer(engines.ScriptedEngine(script, tokenizer="bytes"), store) as server:

        def once(instrumented: bool) -> float:
            handle = instrument() if instrumented else None
            try:
                with tracer.rollout("2+3?") as ro:
                    llm = server.llm(ro.id)
                    t0 = time.perf_counter()
                    out = run(llm)
                    elapsed = time.perf_counter() - t0
            finally:
                if handle is not None:
                    handle.uninstrument()
            assert "5" in str(out), out
            return elapsed

        for _ in range(warmup):
            once(False)
            once(True)
        rng = random.Random(0)
        for _ in range(runs):  # pairs in a random order, garbage collected before each run, so that
            pair = [False, True]  # leftover work of one kind does not always land on the other
            rng.shuffle(pair)
            for instrumented in pair:
                gc.collect()
                times[instrumented].append(once(instrumented))
        spans = sum(len(store.spans(r.rollout_id)) for r in store.rollouts())
        joined = [t for t in agl.transitions(store) if t.response_token_ids is not None]
    store.close()
    plain, instr = times[False], times[True]
    med_p, med_i = statistics.median(plain), statistics.median(instr)
    mean_p, mean_i = statistics.fmean(plain), statistics.fmean(instr)
    return {
        "framework": name,
        "version": _version(name),
        "runs": runs,
        "plain_median_ms": med_p * 1e3,
        "instr_median_ms": med_i * 1e3,
        "added_median": med_i / med_p - 1,
        "plain_mean_ms": mean_p * 1e3,
        "instr_mean_ms": mean_i * 1e3,
        "added_mean": mean_i / mean_p - 1,
        "spans": spans,
        "transitions": len(joined),
    }


def _version(name: str) -> str:
    dist = {
        "langchain": "langchain-core",
        "openai_agents": "openai-agents",
        "autogen": "autogen-agentchat",
        "crewai": "crewai",
    }[name]
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framework | version | runs each | plain median ms | instrumented median ms | added (median) "
        "| plain mean ms | instrumented mean ms | added (mean) | target < 5% |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ok = "met" if r["added_median"] < TARGET else "NOT met"
        lines.append(
            f"| {r['framework']} | {r['version']} | {r['runs']} | {r['plain_median_ms']:.1f} | "
            f"{r['instr_median_ms']:.1f} | {r['added_median']:+.1%} | {r['plain_mean_ms']:.1f} | "
            f"{r['instr_mean_ms']:.1f} | {r['added_mean']:+.1%} | {ok} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table, write ``adapters_results.md``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=100, help="timed runs per side (plain and instrumented)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per side first")
    p.add_argument("--frameworks", nargs="*", default=list(CASES), choices=list(CASES))
    p.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    for name in args.frameworks:
        rows.append(bench(name, args.runs, args.warmup, args.store))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    load_after = os.getloadavg()
    out = table(rows)
    print(out)
    if args.no_write:
        return
    cmd = "python -m benchmarks.perf.bench_adapters" + (
        "" if argv is None and args.runs == 100 else f" --runs {args.runs}"
    )
    text = (
        "# Adapter overhead (instrumented vs plain runs of the same agent)\n\n"
        f"Command: `{cmd}{'' if args.store == 'memory' else ' --store sqlite'}`  \n"
        f"Date: {dt.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"no GPU; Python {platform.python_version()}, openai {metadata.version('openai')}.  \n"
        "Workload per run: one agent with one tool (2 LLM calls + 1 tool call) against ScriptedEngine "
        f"behind a PolicyServer on 127.0.0.1, {args.store} store; a rollout per run on both sides; "
        "instrumented runs "
        "use the framework's zero-code `instrument()` (spans + join). Runs in plain/instrumented pairs, each "
        f"pair in a seeded random order, `gc.collect()` before each run, "
        f"after {args.warmup} warm-up runs each; times are the agent run's wall clock.  \n"
        f"Load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)} "
        "(other processes on this machine affect the numbers).\n\n"
        f"{out}\n\n"
        "Spans and transitions recorded per framework (both sides together; the server records "
        "every call):\n\n"
        + "\n".join(
            f"- {r['framework']}: {r['spans']} spans, {r['transitions']} transitions with token ids"
            for r in rows
        )
        + "\n"
    )
    (HERE / "adapters_results.md").write_text(text)


if __name__ == "__main__":
    main()
