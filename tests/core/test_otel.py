"""OpenTelemetry both ways, with the real opentelemetry-sdk."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Status, StatusCode

import agentlightning_lite as agl


@pytest.fixture
def otel(tracer: agl.Tracer):
    provider = TracerProvider()
    provider.add_span_processor(agl.otel.SpanProcessor(tracer))
    yield provider.get_tracer("test-instrumentation")
    provider.shutdown()


def genai_agent_run(otel_tracer) -> None:
    """What a GenAI-conventions instrumentation emits for agent -> chat -> failing tool."""
    with otel_tracer.start_as_current_span("invoke_agent planner") as a:
        a.set_attribute("gen_ai.operation.name", "invoke_agent")
        a.set_attribute("gen_ai.agent.name", "planner")
        with otel_tracer.start_as_current_span("chat smollm2") as c:
            c.set_attributes(
                {
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "smollm2-135m",
                    "gen_ai.agent.name": "planner",
                    "gen_ai.input.messages": json.dumps([{"role": "user", "content": "12*7?"}]),
                    "gen_ai.output.messages": json.dumps([{"role": "assistant", "content": "calling calc"}]),
                    "gen_ai.usage.input_tokens": 9,
                    "gen_ai.usage.output_tokens": 3,
                }
            )
        with otel_tracer.start_as_current_span("execute_tool calc") as t:
            t.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "calc",
                    "gen_ai.tool.call.id": "call_9",
                    "gen_ai.tool.call.arguments": '{"expr": "12*7"}',
                }
            )
            t.record_exception(ZeroDivisionError("division by zero"))
            t.set_status(Status(StatusCode.ERROR, "tool failed"))


def test_genai_spans_land_in_current_rollout(tracer: agl.Tracer, otel) -> None:
    with tracer.rollout("12*7?", mode="train") as ro:
        with tracer.span("chain", "my_pipeline") as outer:
            genai_agent_run(otel)
        ro.reward(1.0)
    spans = {s.name: s for s in tracer.store.spans(ro.id)}
    agent, chat, tool = spans["invoke_agent planner"], spans["chat smollm2"], spans["calc"]
    assert agent.kind == "agent" and agent.agent == "planner"
    assert agent.parent_id == outer.id  # an OTel root span nests under the open agl span
    assert chat.kind == "llm" and chat.model == "smollm2-135m" and chat.parent_id == agent.span_id
    assert chat.input == [{"role": "user", "content": "12*7?"}]
    assert chat.output == [{"role": "assistant", "content": "calling calc"}]
    assert chat.attributes["gen_ai.usage.input_tokens"] == 9
    assert tool.kind == "tool" and tool.status == "error" and tool.error == "tool failed"
    assert tool.input == {"expr": "12*7"} and tool.attributes["tool_call_id"] == "call_9"
    ts = agl.transitions(
        tracer.store, credit=agl.credit.Discounted(1.0), air=[agl.air.ToolStatus(error=-0.5)]
    )
    assert [(t.agent, t.reward) for t in ts] == [("planner", 0.5)]


def test_spans_outside_rollout_get_one_rollout_per_trace(tracer: agl.Tracer, otel) -> None:
    genai_agent_run(otel)
    genai_agent_run(otel)
    rollouts = tracer.store.rollouts()
    assert len(rollouts) == 2
    for ro in rollouts:
        assert ro.mode == "trace" and ro.status == "succeeded"
        assert len(ro.metadata["otel_trace_id"]) == 32
        assert [s.kind for s in tracer.store.spans(ro.rollout_id)] == ["agent", "llm", "tool"]


def test_legacy_indexed_prompt_attributes(tracer: agl.Tracer, otel) -> None:
    with tracer.rollout("t") as ro:
        with otel.start_as_current_span("openai.chat") as s:
            s.set_attributes(
                {
                    "gen_ai.prompt.0.role": "user",
                    "gen_ai.prompt.0.content": "hi",
                    "gen_ai.completion.0.role": "assistant",
                    "gen_ai.completion.0.content": "hello",
                }
            )
    (span,) = tracer.store.spans(ro.id)
    assert span.kind == "llm"
    assert span.input == [{"role": "user", "content": "hi"}]
    assert span.output == [{"role": "assistant", "content": "hello"}]


def test_text_of_another_instrumentation_stays_text(tracer: agl.Tracer, otel) -> None:
    """In spans another instrumentation made, only objects and arrays are decoded (``42`` stays text),
    and text that only looks like JSON, nested deeper than the decoder goes, is kept as text instead
    of raising into the program when the span ends."""
    deep = "[" * 100_000
    with tracer.rollout("t") as ro:
        with otel.start_as_current_span("execute_tool calc") as t:
            t.set_attributes(
                {
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "calc",
                    "gen_ai.tool.call.arguments": deep,
                    "gen_ai.tool.call.result": "42",
                }
            )
    (span,) = tracer.store.spans(ro.id)
    assert span.kind == "tool" and span.input == deep and span.output == "42"


def make_episode(tracer: agl.Tracer) -> str:
    with tracer.rollout("q") as ro:
        with tracer.span("agent", "writer", agent="writer"):
            with tracer.span("llm", "chat", input=[{"role": "user", "content": "q"}], model="policy") as sp:
                sp.set_output({"role": "assistant", "content": "SELECT 1"})
                sp.set_tokens([1, 2], [3, 4, 5], [-0.5, -0.25, -0.125])
                sp.set_attribute("usage", {"prompt_tokens": 2})
            with tracer.span(
                "tool", "run_sql", input={"sql": "SELECT 1"}, attributes={"tool_call_id": "c1"}
            ) as t:
                t.set_error("OperationalError: boom")
        ro.reward(0.5)
    return ro.id


def test_export_to_otel_exporter_and_round_trip(tracer: agl.Tracer) -> None:
    rid = make_episode(tracer)
    exporter = InMemorySpanExporter()
    assert agl.otel.export(tracer.store, exporter) == 4
    exported = {s.name: s for s in exporter.get_finished_spans()}
    chat = exported["chat"]
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.request.model"] == "policy"
    assert chat.attributes["gen_ai.agent.name"] == "writer"
    assert json.loads(chat.attributes["gen_ai.input.messages"]) == [{"role": "user", "content": "q"}]
    assert tuple(chat.attributes["agentlightning.response_token_ids"]) == (3, 4, 5)
    assert chat.parent.span_id == exported["writer"].context.span_id
    assert chat.context.trace_id == int(rid, 16)
    assert exported["run_sql"].status.status_code == StatusCode.ERROR

    # round trip into a fresh store gives back the same spans
    other = agl.Tracer(agl.MemoryStore())
    agl.otel.SpanProcessor(other).ingest(exporter.get_finished_spans())
    fields = (
        "span_id",
        "parent_id",
        "kind",
        "name",
        "agent",
        "status",
        "error",
        "input",
        "output",
        "model",
        "prompt_token_ids",
        "response_token_ids",
        "response_logprobs",
    )
    before = [s.model_dump(include=set(fields)) for s in tracer.store.spans(rid)]
    after = [s.model_dump(include=set(fields)) for s in other.store.spans(rid)]
    assert after == before
    assert other.store.spans(rid)[1].attributes["usage"] == {"prompt_tokens": 2}


def test_mirror_store_exports_live_alongside_sdk_pipeline(tmp_path) -> None:
    exporter = InMemorySpanExporter()
    store = agl.otel.MirrorStore(agl.SQLiteStore(tmp_path / "m.db"), exporter)
    rid = make_episode(agl.Tracer(store))
    assert [s.name for s in exporter.get_finished_spans()] == ["chat", "run_sql", "writer", "reward"]
    assert len(store.spans(rid)) == 4 and store.get_rollout(rid).reward == 0.5
    store.close()
    # the OTel SDK's own processors accept our spans too
    exporter2 = InMemorySpanExporter()
    SimpleSpanProcessor(exporter2).on_end(agl.otel.to_otel(agl.SQLiteStore(tmp_path / "m.db").spans(rid)[0]))
    assert exporter2.get_finished_spans()[0].name == "writer"


def test_package_works_without_opentelemetry() -> None:
    code = """
import sys
sys.modules["opentelemetry"] = None  # make every opentelemetry import fail
import agentlightning_lite as agl
tracer = agl.Tracer()
with tracer.rollout("t") as ro:
    with tracer.span("llm", "chat"):
        pass
    ro.reward(1.0)
assert [t.reward for t in agl.transitions(tracer.store)] == [1.0]
try:
    agl.otel.SpanProcessor(tracer)
except ImportError as e:
    print("IMPORT-ERROR:", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (
        "IMPORT-ERROR: OpenTelemetry support needs the SDK: pip install 'agentlightning-lite[otel]'"
        in out.stdout
    )
