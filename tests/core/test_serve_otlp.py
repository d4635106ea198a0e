"""``agl-lite serve`` takes OpenTelemetry spans: a stock OTLP/HTTP exporter posts to ``/v1/traces``
of the server the command builds (real uvicorn on 127.0.0.1) and the spans land in the SQLite file."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
httpx = pytest.importorskip("httpx")

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: E402
from opentelemetry.sdk.resources import Resource  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

import agentlightning_lite as agl  # noqa: E402
from agentlightning_lite.cli.serve import make_server  # noqa: E402
from agentlightning_lite.serving import engines  # noqa: E402

KEY = "k-serve"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, Path]]:
    db = tmp_path / "runs.db"
    store = agl.SQLiteStore(db)
    server = make_server(engines.ScriptedEngine(["4"]), store, port=0, api_key=KEY, flush=True)
    server.start()
    try:
        yield server, db
    finally:
        server.stop()
        store.close()


def _agent_spans(resource: dict[str, str]) -> list[ReadableSpan]:
    """What an instrumented agent produces: an agent span with a tool call inside (GenAI conventions)."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create(resource))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("my-agent")
    with tracer.start_as_current_span("invoke_agent solver") as agent:
        agent.set_attribute("gen_ai.operation.name", "invoke_agent")
        agent.set_attribute("gen_ai.agent.name", "solver")
        with tracer.start_as_current_span("execute_tool calculator") as tool:
            tool.set_attribute("gen_ai.operation.name", "execute_tool")
            tool.set_attribute("gen_ai.tool.name", "calculator")
    provider.shutdown()
    return list(memory.get_finished_spans())


def _in_file(db: Path, rollout_id: str) -> list[agl.Span]:
    with agl.SQLiteStore(db) as reader:  # another connection to the server's file
        return reader.spans(rollout_id)


def test_a_stock_otlp_exporter_reaches_agl_lite_serve(served: tuple[Any, Path]) -> None:
    server, db = served
    spans = _agent_spans({"service.name": "ts-agent", "agentlightning.rollout_id": "run-1"})
    url = f"{server.url}/v1/traces"

    wrong = OTLPSpanExporter(endpoint=url, headers={"Authorization": "Bearer nope"}, timeout=10)
    assert wrong.export(spans) is SpanExportResult.FAILURE  # 401: nothing recorded
    assert _in_file(db, "run-1") == []

    right = OTLPSpanExporter(endpoint=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert right.export(spans) is SpanExportResult.SUCCESS
    got = _in_file(db, "run-1")
    assert sorted((s.kind, s.name, s.agent) for s in got) == [
        ("agent", "invoke_agent solver", "solver"),
        ("tool", "calculator", None),
    ]
    tool = next(s for s in got if s.kind == "tool")
    assert tool.parent_id == next(s.span_id for s in got if s.kind == "agent")
    with agl.SQLiteStore(db) as reader:  # the rollout the spans named was started for them
        ro = reader.get_rollout("run-1")
    assert ro is not None and ro.mode == "trace" and ro.metadata["source"] == "otlp"


def test_otlp_json_the_rollout_header_and_bad_requests(served: tuple[Any, Path]) -> None:
    server, db = served
    ro = server.store.start_rollout("a task")  # a rollout started beforehand (from Python, say)
    body = {
        "resourceSpans": [
            {
                "scopeSpans": [
                    {
                        "spans": [
                            {
                                "traceId": "0af7651916cd43dd8448eb211c80319c",
                                "spanId": "b7ad6b7169203331",
                                "name": "execute_tool search",
                                "startTimeUnixNano": "1700000000000000000",
                                "endTimeUnixNano": "1700000000500000000",
                                "attributes": [
                                    {
                                        "key": "gen_ai.operation.name",
                                        "value": {"stringValue": "execute_tool"},
                                    },
                                    {"key": "gen_ai.tool.name", "value": {"stringValue": "search"}},
                                ],
                            }
                        ]
                    }
                ]
            }
        ]
    }
    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, timeout=10) as c:
        r = c.post("/v1/traces", json=body)  # no key
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        plain = json.loads(json.dumps(body).replace("0af76519", "1af76519").replace("b7ad6b71", "c7ad6b71"))
        r = c.post("/v1/traces", json=plain, headers=auth)  # names no rollout: the trace is its own
        assert r.status_code == 200 and r.json() == {}
        r = c.post("/v1/traces", content=b"x", headers={**auth, "content-type": "text/plain"})
        assert r.status_code == 415
        r = c.post(
            "/v1/traces", content=b"\xff\x00", headers={**auth, "content-type": "application/x-protobuf"}
        )
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_otlp"
        r = c.post("/v1/traces", json=body, headers={**auth, "X-Agl-Rollout-Id": ro.rollout_id})
        assert r.status_code == 200 and r.json() == {}
        body["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "b7ad6b7169203332"
        r = c.post(f"/rollout/{ro.rollout_id}/v1/traces", content=json.dumps(body), headers=auth)
        assert r.status_code == 200
    got = _in_file(db, ro.rollout_id)
    assert [(s.kind, s.name, s.duration) for s in got] == [("tool", "search", 0.5)] * 2
    own = "otel-1af7651916cd43dd8448eb211c80319c"
    assert [(s.kind, s.name) for s in _in_file(db, own)] == [("tool", "search")]
    with agl.SQLiteStore(db) as reader:
        assert {r.rollout_id for r in reader.rollouts()} == {ro.rollout_id, own}  # nothing else started
        assert reader.get_rollout(own).status == "succeeded"  # its root span came: the trace is complete


def test_a_stock_exporter_without_rollout_ids_gets_a_trace_rollout_per_trace(
    served: tuple[Any, Path],
) -> None:
    """opentelemetry-sdk's BatchSpanProcessor and OTLP/HTTP exporter, API key set, 50 spans in 5
    traces naming no rollout: every batch is taken (200) and each trace is one ``trace`` rollout."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    server, db = served
    exporter = OTLPSpanExporter(
        endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {KEY}"}, timeout=10
    )
    results: list[SpanExportResult] = []
    export = exporter.export
    exporter.export = lambda spans: results.append(export(spans)) or results[-1]  # type: ignore[method-assign]
    provider = TracerProvider(resource=Resource.create({"service.name": "plain-agent"}))
    provider.add_span_processor(BatchSpanProcessor(exporter, max_export_batch_size=8))
    tracer = provider.get_tracer("plain-agent")
    trace_ids = []
    for i in range(5):
        with tracer.start_as_current_span(f"invoke_agent a{i}") as root:
            root.set_attribute("gen_ai.operation.name", "invoke_agent")
            root.set_attribute("gen_ai.agent.name", f"a{i}")
            trace_ids.append(root.get_span_context().trace_id)
            for j in range(9):
                with tracer.start_as_current_span(f"execute_tool t{j}") as tool:
                    tool.set_attribute("gen_ai.operation.name", "execute_tool")
                    tool.set_attribute("gen_ai.tool.name", f"t{j}")
    provider.shutdown()
    assert len(results) >= 7 and all(r is SpanExportResult.SUCCESS for r in results), results
    with agl.SQLiteStore(db) as reader:
        rollouts = reader.rollouts(mode="trace")
        assert sorted(r.rollout_id for r in rollouts) == sorted(f"otel-{t:032x}" for t in trace_ids)
        for r in rollouts:
            spans = reader.spans(r.rollout_id)
            assert len(spans) == 10 and sum(s.kind == "agent" for s in spans) == 1
            assert r.status == "succeeded" and r.metadata["source"] == "otlp"
            assert r.metadata["otel_trace_id"] == r.rollout_id.removeprefix("otel-")


@pytest.mark.slow
def test_the_agl_lite_serve_command_takes_otlp(tmp_path: Path) -> None:
    """The command itself, as a user starts it: a process serving smollm2-135m with --db and --api-key."""
    import os
    import re
    import signal
    import subprocess
    import sys
    import time

    db = tmp_path / "runs.db"
    cmd = [sys.executable, "-m", "agentlightning_lite.cli", "serve", "--db", str(db), "--port", "0"]
    cmd += ["--api-key", KEY, "--log-level", "warning"]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        url, seen = None, []
        deadline = time.monotonic() + 180
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"OpenTelemetry spans \(OTLP/HTTP\): (http://\S+/v1/traces)", line)
            url = m.group(1) if m else None
        assert url, "".join(seen)
        spans = _agent_spans({"agentlightning.rollout_id": "cli-run"})
        assert OTLPSpanExporter(endpoint=url, timeout=10).export(spans) is SpanExportResult.FAILURE
        ok = OTLPSpanExporter(endpoint=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
        assert ok.export(spans) is SpanExportResult.SUCCESS
        assert sorted(s.kind for s in _in_file(db, "cli-run")) == ["agent", "tool"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0
