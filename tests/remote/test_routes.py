"""The runner routes over real HTTP: auth on every endpoint, size limits, 4xx for bad input, OTLP in."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import RemoteStore, RunnerClient

KEY = "s3cret"


def test_binds_loopback_by_default() -> None:
    assert agl.RemoteRunners().host == "127.0.0.1"
    assert agl.RayRunners().host == "127.0.0.1"


def test_every_endpoint_wants_the_key(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    rid = store.start_rollout("t").rollout_id
    calls = [
        ("POST", "/agl/v1/claim", {"worker": "w"}),
        ("POST", "/agl/v1/heartbeat", {"worker": "w", "rollout_ids": []}),
        ("POST", f"/agl/v1/rollouts/{rid}/reward", {"reward": 1.0}),  # before its outcome is counted
        ("POST", f"/agl/v1/rollouts/{rid}/complete", {"status": "succeeded"}),
        ("POST", "/agl/v1/rollouts", {"task": "x"}),
        ("GET", "/agl/v1/rollouts", None),
        ("GET", f"/agl/v1/rollouts/{rid}", None),
        ("GET", f"/agl/v1/rollouts/{rid}/spans", None),
        ("POST", "/agl/v1/spans", {"rows": []}),
        ("GET", "/agl/v1/status", None),
        ("POST", "/v1/traces", {"resourceSpans": []}),
        ("POST", f"/rollout/{rid}/v1/traces", {"resourceSpans": []}),
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", f"/rollout/{rid}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("GET", "/v1/models", None),
    ]
    with httpx.Client(base_url=runners.url) as http:
        for method, path, body in calls:
            for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
                r = http.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (method, path, headers, r.text)
                assert r.json()["error"]["code"] == "invalid_api_key"
            r = http.request(method, path, json=body, headers={"authorization": f"Bearer {KEY}"})
            assert r.status_code < 400, (method, path, r.text)
    assert store.get_rollout(rid).reward == 1.0


def test_only_health_and_version_answer_without_the_key(served: Callable[..., agl.RemoteRunners]) -> None:
    """``GET /health`` and ``GET``/``HEAD /version`` answer any caller, as vLLM's do (its key guards
    ``/v1`` only; VLLMEngine reads ``/version`` before it sends a key): liveness, the package version and
    the weights version, nothing from the store. Everything else, the LoRA routes too, wants the key."""
    runners = served(agl.MemoryStore(), api_key=KEY)
    with httpx.Client(base_url=runners.url) as http:
        health = http.get("/health")
        assert health.status_code == 200 and set(health.json()) == {"status", "model", "weights_version"}
        version = http.get("/version")
        assert version.status_code == 200
        assert version.json() == {"version": agl.__version__, "server": "agentlightning-lite"}
        assert http.head("/version").status_code == 200
        for path, body in (
            ("/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/nowhere"}),
            ("/v1/unload_lora_adapter", {"lora_name": "a"}),
            ("/v1/completions", {"prompt": "hi"}),
        ):
            r = http.post(path, json=body)
            assert r.status_code == 401, (path, r.text)
        assert http.post("/version").status_code == 405  # read-only


def test_malformed_input_gets_4xx_json_and_the_server_keeps_serving(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, max_body_bytes=4096)
    rid = store.start_rollout("t").rollout_id
    good_row = [
        "s1",
        rid,
        None,
        "tool",
        "t",
        None,
        1.0,
        2.0,
        "ok",
        None,
        "null",
        "null",
        "{}",
        None,
        None,
        None,
        None,
    ]
    bad = [
        ("POST", "/agl/v1/claim", b"{not json"),
        ("POST", "/agl/v1/claim", b"[1, 2]"),
        ("POST", "/agl/v1/claim", json.dumps({"worker": 3}).encode()),
        ("POST", "/agl/v1/claim", json.dumps({"worker": "w", "wait": -1}).encode()),
        ("POST", "/agl/v1/claim", b"[" * 100_000 + b"]" * 100_000),  # too big, and too deep
        ("POST", "/agl/v1/claim", b"[" * 2000 + b"]" * 2000),  # too deep
        ("POST", "/agl/v1/heartbeat", json.dumps({"worker": "w", "rollout_ids": "x"}).encode()),
        ("POST", f"/agl/v1/rollouts/{rid}/complete", json.dumps({"status": "running"}).encode()),
        ("POST", f"/agl/v1/rollouts/{rid}/complete", b'{"status": "succeeded", "reward": NaN}'),
        ("POST", f"/agl/v1/rollouts/{rid}/reward", json.dumps({"reward": "high"}).encode()),
        ("POST", "/agl/v1/rollouts/nope/reward", json.dumps({"reward": 1}).encode()),
        ("POST", "/agl/v1/rollouts", json.dumps({"mode": "weird"}).encode()),
        ("POST", "/agl/v1/rollouts", json.dumps({"rollout_id": rid}).encode()),  # exists: 409
        ("GET", "/agl/v1/rollouts?status=odd", None),
        ("GET", "/agl/v1/rollouts/nope", None),
        ("POST", "/agl/v1/spans", json.dumps({}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"rows": [[1, 2, 3]]}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"rows": [[*good_row[:3], "bogus", *good_row[4:]]]}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"rows": [[*good_row[:10], "{bad", *good_row[11:]]]}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"rows": [[*good_row[:14], ["x"], *good_row[15:]]]}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"rows": [["s2", "nope", *good_row[2:]]]}).encode()),
        ("POST", "/agl/v1/spans", json.dumps({"spans": [{"span_id": "x"}]}).encode()),
        ("POST", "/v1/traces", b"\x00\xffnot protobuf"),
        ("POST", "/v1/traces", json.dumps({"resourceSpans": "x"}).encode()),
        ("POST", "/v1/traces", json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{}]}]}]}).encode()),
    ]
    with httpx.Client(base_url=runners.url) as http:
        for method, path, content in bad:
            ctype = (
                "application/x-protobuf" if content and content.startswith(b"\x00") else "application/json"
            )
            r = http.request(method, path, content=content, headers={"content-type": ctype})
            assert 400 <= r.status_code < 500, (
                path,
                content[:60] if content else None,
                r.status_code,
                r.text,
            )
            assert "message" in r.json()["error"]
        r = http.post("/agl/v1/spans", json={"rows": [good_row]})
        assert r.status_code == 200 and r.json() == {"accepted": 1}
        r = http.post("/agl/v1/spans", content=b"x" * 5000, headers={"content-type": "application/json"})
        assert r.status_code == 413
        # a chunked body with no Content-Length is cut off at the limit too
        r = http.post("/agl/v1/spans", content=iter([b"x" * 3000, b"x" * 3000]))
        assert r.status_code == 413
        assert http.get("/health").json()["status"] == "ok"
    assert [s.span_id for s in store.spans(rid)] == ["s1"]


def test_spans_record_the_weights_version_of_their_claim(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    runners = served(store)
    [job] = runners.queue.submit([("t", "train", {})])  # type: ignore[union-attr]
    runners.server.engine.version = 7
    client = RunnerClient(runners.url)
    claimed = client.claim("w", wait=1.0)
    assert claimed is not None and claimed["weights_version"] == 7
    runners.server.engine.version = 8  # the policy moves on while the rollout runs
    remote = RemoteStore(client)
    tracer = agl.Tracer(remote)
    remote.register(
        agl.Rollout(rollout_id=claimed["rollout_id"], mode="train", start_time=0.0), lease=claimed["lease"]
    )
    with tracer.rollout(rollout_id=claimed["rollout_id"]) as ro:
        with tracer.span("tool", "calc") as sp:
            sp.set_output(4)
        agl.emit_reward(1.0)
    assert remote.last_result[ro.id]["counted"] is True
    spans = store.spans(ro.id)
    assert [s.kind for s in spans] == ["tool", "reward"]
    assert {s.attributes["weights_version"] for s in spans} == {7}
    assert job.status == "succeeded" and job.reward == 1.0
    remote.close()
    client.close()


def _otlp_json(rid_attr: str | None, trace: str = "0af7651916cd43dd8448eb211c80319c") -> dict:
    resource = [{"key": "agentlightning.rollout_id", "value": {"stringValue": rid_attr}}] if rid_attr else []
    tool = {
        "traceId": trace,
        "spanId": "b7ad6b7169203331",
        "parentSpanId": "a7ad6b7169203331",
        "name": "execute_tool calc",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000250000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "calculator"}},
            {"key": "gen_ai.tool.call.arguments", "value": {"stringValue": '{"expr": "2+2"}'}},
            {"key": "n", "value": {"intValue": "3"}},
        ],
        "status": {"code": 2, "message": "division by zero"},
    }
    return {"resourceSpans": [{"resource": {"attributes": resource}, "scopeSpans": [{"spans": [tool]}]}]}


@pytest.mark.parametrize("how", ["resource", "header", "url"])
def test_otlp_json_lands_in_its_rollout(served: Callable[..., agl.RemoteRunners], how: str) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    rid = store.start_rollout("t").rollout_id
    headers = {"authorization": f"Bearer {KEY}"}
    path = "/v1/traces"
    body = _otlp_json(rid if how == "resource" else None)
    if how == "header":
        headers["x-agl-rollout-id"] = rid
    if how == "url":
        path = f"/rollout/{rid}/v1/traces"
    r = httpx.post(runners.url + path, json=body, headers=headers)
    assert r.status_code == 200, r.text
    [sp] = store.spans(rid)
    assert (sp.kind, sp.name, sp.status, sp.error) == ("tool", "calculator", "error", "division by zero")
    assert sp.input == {"expr": "2+2"} and sp.attributes["n"] == 3 and sp.duration == 0.25
    assert sp.parent_id == "a7ad6b7169203331" and "weights_version" in sp.attributes


def test_otlp_without_a_rollout_is_refused(served: Callable[..., agl.RemoteRunners]) -> None:
    runners = served()
    r = httpx.post(runners.url + "/v1/traces", json=_otlp_json(None))
    message = r.json()["error"]["message"]  # the trainer trains only on rollouts it can attribute
    assert r.status_code == 400 and "agentlightning.rollout_id" in message and "names no rollout" in message
    r = httpx.post(runners.url + "/v1/traces", json=_otlp_json("no-such-rollout"))
    assert r.status_code == 404


def test_otlp_protobuf_from_the_stock_python_exporter(served: Callable[..., agl.RemoteRunners]) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    rid = store.start_rollout("t").rollout_id
    exporter = OTLPSpanExporter(
        endpoint=runners.url + "/v1/traces", headers={"authorization": f"Bearer {KEY}"}
    )
    provider = TracerProvider(resource=Resource.create({"agentlightning.rollout_id": rid}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("invoke_agent solver") as root:
        root.set_attribute("gen_ai.operation.name", "invoke_agent")
        root.set_attribute("gen_ai.agent.name", "solver")
        with tracer.start_as_current_span("execute_tool search") as child:
            child.set_attribute("gen_ai.operation.name", "execute_tool")
            child.set_attribute("gen_ai.tool.name", "search")
            child.set_attribute("tags", ["a", "b"])
    provider.shutdown()
    spans = {s.name: s for s in store.spans(rid)}
    assert spans["search"].kind == "tool" and spans["search"].attributes["tags"] == ["a", "b"]
    assert spans["search"].parent_id == spans["invoke_agent solver"].span_id
    assert spans["invoke_agent solver"].agent == "solver"


class _CountingStore(agl.MemoryStore):
    """Counts look-ups of rollouts (a rollout the server remembers needs none)."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    def get_rollout(self, rollout_id: str) -> agl.Rollout | None:
        self.lookups += 1
        return super().get_rollout(rollout_id)


def test_the_rollouts_the_server_remembers_are_bounded(
    served: Callable[..., agl.RemoteRunners], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning_lite.remote import routes
    from agentlightning_lite.serving.state import RolloutState

    store = _CountingStore()
    runners = served(store)
    monkeypatch.setattr(routes, "KNOWN_SIZE", 3)
    server = runners.server
    server.rollouts = RolloutState(size=3)
    rids = [store.start_rollout(f"t{i}").rollout_id for i in range(5)]
    with httpx.Client(base_url=runners.url) as http:
        for _ in range(2):  # round robin over 5 rollouts: each is forgotten before it comes back
            for rid in rids:
                before = store.lookups
                chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                assert http.post(f"/rollout/{rid}/v1/chat/completions", json=chat).status_code == 200
                r = http.post("/agl/v1/spans", json={"rows": [_row(f"s-{rid}-{_}", rid)]})
                assert r.json() == {"accepted": 1}
                assert store.lookups - before == 2  # one by the LLM route, one by the span route
    assert server.rollouts.known_count == 3
    assert all(len([s for s in store.spans(rid) if s.kind == "tool"]) == 2 for rid in rids)


def _row(span_id: str, rid: str) -> list:
    return [span_id, rid, None, "tool", "t", None, 1.0, 2.0, "ok", None, "null", "null", "{}",
            None, None, None, None]  # fmt: skip


def test_the_remote_stores_caches_are_bounded(
    served: Callable[..., agl.RemoteRunners], monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning_lite.remote import remote_store

    monkeypatch.setattr(remote_store, "KEEP", 2)
    store = agl.MemoryStore()
    runners = served(store)
    client = RunnerClient(runners.url)
    remote = RemoteStore(client)
    tracer = agl.Tracer(remote)
    for i in range(5):  # trace-mode rollouts the runner process starts itself
        with tracer.rollout(f"t{i}") as ro:
            agl.emit_reward(1.0)
        assert remote.last_result[ro.id]["counted"] is False
    assert len(remote._known) == 2 and len(remote.last_result) == 2
    assert [r.status for r in store.rollouts()] == ["succeeded"] * 5
    remote.close()
    client.close()


def test_the_cancelled_rollouts_the_server_remembers_are_bounded() -> None:
    """One entry per cancelled rollout would grow for ever over a long run: the last 10,000 stay."""
    from agentlightning_lite.serving.engines import ScriptedEngine

    store = agl.MemoryStore()
    with agl.PolicyServer(ScriptedEngine(["4"], tokenizer="bytes"), store) as server:
        rids = [f"ro-{i}" for i in range(10_050)]
        for rid in rids:
            assert server.cancel_rollout(rid) == 0
        assert server.rollouts.cancelled_count == 10_000
        assert not server.rollouts.is_cancelled(rids[0]) and server.rollouts.is_cancelled(rids[-1])
        last = store.start_rollout("t").rollout_id
        server.cancel_rollout(last)
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = httpx.post(f"{server.url}/rollout/{last}/v1/chat/completions", json=chat)
        assert r.status_code == 409 and r.json()["error"]["code"] == "rollout_cancelled"
        assert server.rollouts.cancelled_count == 10_000 and store.spans(last) == []
