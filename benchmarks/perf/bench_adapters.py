"""Adapter overhead: the same agent run with and without the framework adapter, per framework.

Each framework runs a single agent with one tool (two LLM calls and one tool call) against a
ScriptedEngine behind a real PolicyServer on 127.0.0.1. Every run opens a rollout (the server needs one
to route the calls); instrumented runs also record the framework's spans and join them with the server's
token-level spans. Each round runs the agent in a random (seeded) order, with a garbage collection and
a short pause before every run: plain, instrumented, plain again as a control whose "overhead" over
plain shows how much two identical configurations differ on this machine (the noise floor), and with
the framework's OpenInference instrumentor when installed (what a user would pick instead). The
overhead is the ratio of the medians, with a 95% bootstrap interval over rounds.

    python -m benchmarks.perf.bench_adapters                 # 200 rounds each, writes adapters_results.md
    python -m benchmarks.perf.bench_adapters --runs 20 --frameworks langchain --no-write
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import importlib
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
SETTLE_S = 0.05  #: pause before each timed run


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


ARMS = ("plain", "control", "instrumented", "openinference")

#: What a user would otherwise install to trace these frameworks: the OpenInference instrumentors
#: (OpenTelemetry spans; no token ids, no join), exporting through a SimpleSpanProcessor to an
#: in-memory exporter, the cheapest OpenTelemetry set-up there is. Framework -> (module, instrumentor
#: class); the module's distribution is its name with dashes.
OPENINFERENCE = {
    "langchain": ("openinference.instrumentation.langchain", "LangChainInstrumentor"),
    "openai_agents": ("openinference.instrumentation.openai_agents", "OpenAIAgentsInstrumentor"),
    "autogen": ("openinference.instrumentation.autogen_agentchat", "AutogenAgentChatInstrumentor"),
    "crewai": ("openinference.instrumentation.crewai", "CrewAIInstrumentor"),
}


def openinference(name: str) -> tuple[Callable[[], Any], Any] | None:
    """``(install, exporter)`` for the framework's OpenInference instrumentor, or None when not installed;
    ``install()`` returns a handle whose ``uninstrument()`` removes it."""
    module_name, cls_name = OPENINFERENCE[name]
    try:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        instrumentor = getattr(importlib.import_module(module_name), cls_name)()
    except ImportError:
        return None
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))

    class Handle:
        def uninstrument(self) -> None:
            instrumentor.uninstrument()

    def install() -> Handle:
        instrumentor.instrument(tracer_provider=provider)
        return Handle()

    return install, exporter


def bench(name: str, runs: int, warmup: int, store_kind: str) -> dict[str, Any]:
    """Time ``runs`` rounds of one framework: a plain run, a second plain run (the control, which
    shows the noise floor: plain against plain), a run with our adapter and one with OpenInference's
    instrumentor (when installed), in a random order each round."""
    run, instrument = CASES[name]()
    oi = openinference(name)
    arms = [a for a in ARMS if a != "openinference" or oi is not None]
    installers: dict[str, Callable[[], Any]] = {"instrumented": instrument}
    if oi is not None:
        installers["openinference"] = oi[0]
    store: agl.Store = (
        agl.MemoryStore() if store_kind == "memory" else agl.SQLiteStore(f"/tmp/agl_bench_{name}.db")
    )
    tracer = agl.Tracer(store)
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    ours: list[str] = []  # the timed instrumented runs' rollouts
    with PolicyServer(engines.ScriptedEngine(script, tokenizer="bytes"), store) as server:

        def once(arm: str) -> float:
            handle = installers[arm]() if arm in installers else None
            try:
                with tracer.rollout("2+3?") as ro:
                    llm = server.llm(ro.id)
                    gc.collect()
                    time.sleep(SETTLE_S)  # background work of the previous run (threads) finishes first
                    t0 = time.perf_counter()
                    out = run(llm)
                    elapsed = time.perf_counter() - t0
            finally:
                if handle is not None:
                    handle.uninstrument()
            assert "5" in str(out), out
            if arm == "instrumented":
                ours.append(ro.id)
            return elapsed

        for _ in range(warmup):
            for arm in arms:
                once(arm)
        # what the frameworks and the warm-up left is never garbage again: later collections skip it
        gc.collect()
        gc.freeze()
        ours.clear()
        if oi is not None:
            oi[1].clear()
        rng = random.Random(0)
        for _ in range(runs):  # rounds in a random (seeded) order, garbage collected before each run,
            rng.shuffle(arms)  # so that leftover work of one arm does not always land on another
            for arm in arms:
                times[arm].append(once(arm))
        gc.unfreeze()
        spans = sum(len(store.spans(rid)) for rid in ours)
        joined = [t for t in agl.transitions(store, rollout_ids=ours) if t.response_token_ids is not None]
    store.close()
    plain, control, instr = times["plain"], times["control"], times["instrumented"]
    lo, hi = bootstrap_ci(plain, instr, random.Random(1))
    row: dict[str, Any] = {
        "framework": name,
        "version": _version(name),
        "runs": runs,
        "plain_median_ms": statistics.median(plain) * 1e3,
        "instr_median_ms": statistics.median(instr) * 1e3,
        "added_median": statistics.median(instr) / statistics.median(plain) - 1,
        "added_ci": (lo, hi),
        "control_median": statistics.median(control) / statistics.median(plain) - 1,
        "plain_mean_ms": statistics.fmean(plain) * 1e3,
        "instr_mean_ms": statistics.fmean(instr) * 1e3,
        "added_mean": statistics.fmean(instr) / statistics.fmean(plain) - 1,
        "spans_per_run": spans / runs,
        "transitions_per_run": len(joined) / runs,
        "oi": None,
    }
    if oi is not None:
        o = times["openinference"]
        row["oi"] = {
            "dist": (dist := OPENINFERENCE[name][0].replace(".", "-").replace("_", "-")),
            "version": _dist_version(dist),
            "median_ms": statistics.median(o) * 1e3,
            "added_median": statistics.median(o) / statistics.median(plain) - 1,
            "added_ci": bootstrap_ci(plain, o, random.Random(2)),
            "spans_per_run": len(oi[1].get_finished_spans()) / runs,
        }
    return row


def bootstrap_ci(
    plain: list[float], instr: list[float], rng: random.Random, n: int = 2000
) -> tuple[float, float]:
    """95% bootstrap interval of ``median(instr) / median(plain) - 1``, resampling whole rounds."""
    k = len(plain)
    ratios = []
    for _ in range(n):
        idx = [rng.randrange(k) for _ in range(k)]
        ratios.append(statistics.median(instr[i] for i in idx) / statistics.median(plain[i] for i in idx) - 1)
    ratios.sort()
    return ratios[int(0.025 * n)], ratios[int(0.975 * n) - 1]


def _dist_version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _version(name: str) -> str:
    dist = {
        "langchain": "langchain-core",
        "openai_agents": "openai-agents",
        "autogen": "autogen-agentchat",
        "crewai": "crewai",
    }[name]
    return _dist_version(dist)


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| framework | version | runs each | plain median ms | instrumented median ms | **added (median)** "
        "| 95% interval | control: plain vs plain | added (mean) | target < 5% |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ok = "met" if r["added_median"] < TARGET else "NOT met"
        lo, hi = r["added_ci"]
        lines.append(
            f"| {r['framework']} | {r['version']} | {r['runs']} | {r['plain_median_ms']:.1f} | "
            f"{r['instr_median_ms']:.1f} | **{r['added_median']:+.1%}** | {lo:+.1%} to {hi:+.1%} | "
            f"{r['control_median']:+.1%} | {r['added_mean']:+.1%} | {ok} |"
        )
    return "\n".join(lines)


def oi_table(rows: list[dict[str, Any]]) -> str:
    """Our adapter against the OpenInference instrumentor of the same framework."""
    lines = [
        "| framework | ours: added (median) | ours: spans / run | ours: transitions with token ids / run "
        "| OpenInference instrumentor | OpenInference: added (median) | 95% interval "
        "| OpenInference: spans / run |",
        "|---|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        oi = r["oi"]
        if oi is None:
            continue
        lo, hi = oi["added_ci"]
        lines.append(
            f"| {r['framework']} | {r['added_median']:+.1%} | {r['spans_per_run']:.0f} | "
            f"{r['transitions_per_run']:.0f} | {oi['dist']} {oi['version']} | {oi['added_median']:+.1%} | "
            f"{lo:+.1%} to {hi:+.1%} | {oi['spans_per_run']:.0f} |"
        )
    return "\n".join(lines) if len(lines) > 2 else ""


def main(argv: list[str] | None = None) -> None:
    """Run the benchmark, print the table, write ``adapters_results.md``."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=200, help="timed rounds (plain, control, instrumented)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs per side first")
    p.add_argument("--frameworks", nargs="*", default=list(CASES), choices=list(CASES))
    p.add_argument("--store", choices=("memory", "sqlite"), default="memory")
    p.add_argument("--no-write", action="store_true", help="print only")
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    started = time.perf_counter()
    rows = []
    for name in args.frameworks:
        rows.append(bench(name, args.runs, args.warmup, args.store))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    load_after = os.getloadavg()
    minutes = (time.perf_counter() - started) / 60
    out = table(rows)
    versus = oi_table(rows)
    print(out)
    print(versus or "(OpenInference instrumentors not installed: pip install -e '.[benchmarks]')")
    if args.no_write:
        return
    cmd = "python -m benchmarks.perf.bench_adapters" + (
        "" if argv is None and args.runs == 200 else f" --runs {args.runs}"
    )
    text = (
        "# Adapter overhead (instrumented vs plain runs of the same agent)\n\n"
        f"Command: `{cmd}{'' if args.store == 'memory' else ' --store sqlite'}`  \n"
        f"Date: {dt.date.today().isoformat()}; machine: {platform.machine()}, {os.cpu_count()} CPU cores, "
        f"no GPU; Python {platform.python_version()}, openai {metadata.version('openai')}, "
        f"opentelemetry-sdk {_dist_version('opentelemetry-sdk')}.  \n"
        "Workload per run: one agent with one tool (2 LLM calls + 1 tool call) against ScriptedEngine "
        f"behind a PolicyServer on 127.0.0.1, {args.store} store; a rollout per run in every arm. "
        "Arms: plain; instrumented with the framework's zero-code `instrument()` (spans + join with the "
        "server's token-level spans); plain again as a control (plain vs plain shows the noise floor); "
        "and, for comparison, the framework's OpenInference instrumentor exporting OpenTelemetry spans "
        "through a `SimpleSpanProcessor` to an `InMemorySpanExporter`. Instrumentations are installed "
        "before a run and removed after it. Each round runs every arm once in a seeded random order, "
        f"`gc.collect()` (objects alive after the {args.warmup} warm-up rounds are frozen out of "
        f"collection) and a {SETTLE_S * 1e3:.0f} ms pause before each run, so that the previous run's "
        "background threads are done; times are the agent run's wall clock. Overhead = median of the arm "
        "/ median plain - 1, with a 95% bootstrap interval (2,000 resamples of rounds).  \n"
        f"Load average (1/5/15 min) before: {' '.join(f'{x:.2f}' for x in load_before)}; after: "
        f"{' '.join(f'{x:.2f}' for x in load_after)} "
        f"(other processes on this machine affect the numbers). Benchmark wall time {minutes:.1f} min.\n\n"
        f"{out}\n\n"
        + (
            "## Against OpenInference\n\n"
            "The same runs, our adapter next to the OpenInference instrumentor of the framework. Ours "
            "also records the server's token ids for every LLM call (the spans per run include the "
            "server's two LLM spans); OpenInference records the framework's view only.\n\n"
            f"{versus}\n"
            if versus
            else ""
        )
    )
    (HERE / "adapters_results.md").write_text(text)


if __name__ == "__main__":
    main()
