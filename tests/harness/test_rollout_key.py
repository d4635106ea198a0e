"""A rollout's own key: a program run for one rollout reaches that rollout's model calls and nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

FAKE = str(Path(__file__).with_name("fake_harness.py"))


def test_the_rollout_key_reaches_its_rollout_only() -> None:
    store = agl.MemoryStore()
    with PolicyServer(engines.ScriptedEngine(["ok"] * 8), store, api_key="server-key") as server:
        mine, other = store.start_rollout("a").rollout_id, store.start_rollout("b").rollout_id
        key = server.llm(mine).rollout_key
        assert key and key != "server-key" and key == server.rollout_key(mine) != server.rollout_key(other)
        body = {"model": server.model_name, "messages": [{"role": "user", "content": "hi"}]}

        def post(path: str, key: str, header: str = "authorization", **kw: object) -> int:
            value = f"Bearer {key}" if header == "authorization" else key
            return httpx.post(f"{server.url}{path}", json=body, headers={header: value}, **kw).status_code  # type: ignore[arg-type]

        assert post(f"/rollout/{mine}/v1/chat/completions", key) == 200
        assert post(f"/rollout/{mine}/v1/messages", key, header="x-api-key") == 200
        assert (
            httpx.get(
                f"{server.url}/rollout/{mine}/v1/models", headers={"authorization": f"Bearer {key}"}
            ).status_code
            == 200
        )
        assert post(f"/rollout/{other}/v1/chat/completions", key) == 401  # another rollout
        assert post("/v1/chat/completions", key) == 401  # unrouted
        assert (
            httpx.post(
                f"{server.url}/v1/chat/completions",
                json=body,
                headers={"authorization": f"Bearer {key}", "x-agl-rollout-id": other},
            ).status_code
            == 401
        )
        assert post("/v1/load_lora_adapter", key) == 401  # the trainer's routes
        assert (
            post(f"/rollout/{other}/v1/chat/completions", "server-key") == 200
        )  # the server's key reaches all
        assert len(store.spans(mine)) == 2 and len(store.spans(other)) == 1


def test_a_command_agent_gets_the_rollout_key_not_the_servers() -> None:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(
        engines.ScriptedEngine(["a title", "one", "two"]), store, api_key="server-key"
    ) as server:
        agent = agl.CommandAgent([sys.executable, FAKE, "calls,env"], network="host", timeout=60)
        with tracer.rollout("t") as ro:
            assert agent("t", server.llm(ro.id)) == 1.0
        spans = store.spans(ro.id)
    out = json.loads(next(s for s in spans if s.name == "harness").output["stdout"])
    assert out["env"]["OPENAI_API_KEY"] == server.rollout_key(ro.id)
    assert "server-key" not in json.dumps(out["env"])
    assert out["replies"] == ["one", "two"] and len([s for s in spans if s.kind == "llm"]) == 3
