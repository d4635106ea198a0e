"""agl.envs.NemoGym against a resources server on 127.0.0.1 that speaks NeMo Gym's protocol."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl

pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
from starlette.applications import Starlette  # noqa: E402
from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from starlette.routing import Route  # noqa: E402

from agentlightning_lite.serving import PolicyServer, engines  # noqa: E402

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test

TOOLS = [
    {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "strict": True,
    }
]
ROW = {
    "responses_create_params": {
        "input": [
            {"role": "developer", "content": "Answer with one word."},
            {"role": "user", "content": "What is the weather in Oslo?"},
        ],
        "tools": TOOLS,
    },
    "expected": "cold",
}


class WeatherServer:
    """A resources server as NeMo Gym's are: a session cookie from /seed_session, a tool route,
    /verify scoring the final assistant message (1.0 when it says the weather the tool reported)."""

    def __init__(self) -> None:
        self.sessions: dict[str, list[str]] = {}
        self.verified: list[dict[str, Any]] = []
        self.app = Starlette(
            routes=[
                Route("/seed_session", self.seed, methods=["POST"]),
                Route("/get_weather", self.weather, methods=["POST"]),
                Route("/verify", self.verify, methods=["POST"]),
            ]
        )

    async def seed(self, request: Request) -> JSONResponse:
        body = await request.json()
        assert "responses_create_params" in body
        sid = uuid.uuid4().hex
        self.sessions[sid] = []
        reply = JSONResponse({})
        reply.set_cookie("session", sid)
        return reply

    async def weather(self, request: Request) -> JSONResponse:
        sid = request.cookies.get("session")
        if sid not in self.sessions:
            return JSONResponse({"error": "no session"}, status_code=400)
        args = await request.json()
        if "city" not in args:
            return JSONResponse({"error": "city is required"}, status_code=422)
        self.sessions[sid].append(args["city"])
        return JSONResponse({"city": args["city"], "weather": "cold"})

    async def verify(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.verified.append(body)
        sid = request.cookies.get("session", "")
        texts = [
            part["text"]
            for item in body["response"]["output"]
            if item["type"] == "message" and item["role"] == "assistant"
            for part in item["content"]
        ]
        called = self.sessions.get(sid) == ["Oslo"]
        right = bool(texts) and body["expected"] in texts[-1].lower()
        return JSONResponse({**body, "reward": 1.0 if called and right else 0.0})


@pytest.fixture
def resources() -> Iterator[tuple[WeatherServer, str]]:
    app = WeatherServer()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.02)
    yield app, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(5)
    sock.close()


def play(env: agl.envs.NemoGym, replies: list[Any]) -> tuple[float, agl.MemoryStore, str]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout(env.tasks[0]) as ro:
            reward = env.agent(env.tasks[0], server.llm(ro.id))
            ro.reward(reward)
    return reward, store, ro.id


CALL = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}


@pytest.mark.parametrize(("answer", "reward"), [("Cold.", 1.0), ("Sunny.", 0.0)])
def test_tool_call_then_verify(resources: tuple[WeatherServer, str], answer: str, reward: float) -> None:
    app, url = resources
    env = agl.envs.NemoGym(url, data=[ROW])
    got, store, rollout_id = play(env, [CALL, answer])
    assert got == reward
    rollout = store.get_rollout(rollout_id)
    assert rollout is not None and rollout.reward == reward
    assert list(app.sessions.values()) == [["Oslo"]]  # the tool ran in the seeded session
    [body] = app.verified
    assert body["expected"] == "cold" and body["responses_create_params"] == ROW["responses_create_params"]
    output = body["response"]["output"]
    assert [o["type"] for o in output] == ["function_call", "function_call_output", "message"]
    assert json.loads(output[0]["arguments"]) == {"city": "Oslo"} and output[0]["name"] == "get_weather"
    assert json.loads(output[1]["output"]) == {"city": "Oslo", "weather": "cold"}
    assert output[1]["call_id"] == output[0]["call_id"]
    assert output[2]["content"][0]["text"] == answer
    tools = [s for s in store.spans(rollout_id) if s.kind == "tool"]
    assert [(s.name, s.status) for s in tools] == [("get_weather", "ok")]
    llm = [s for s in store.spans(rollout_id) if s.kind == "llm"]
    assert len(llm) == 2 and [t["function"]["name"] for t in llm[0].attributes["tools"]] == ["get_weather"]
    assert [t.final_reward for t in agl.transitions(store)] == [reward, reward]


def test_a_failing_tool_call_is_an_error_span(resources: tuple[WeatherServer, str], tmp_path: Path) -> None:
    _, url = resources
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps(ROW) + "\n")
    env = agl.envs.NemoGym(url, data=data)
    bad = {"tool_calls": [{"name": "get_weather", "arguments": {"town": "Oslo"}}]}
    got, store, rollout_id = play(env, [bad, "Cold."])
    assert got == 0.0  # the tool never reported a city: verify says so
    [tool] = [s for s in store.spans(rollout_id) if s.kind == "tool"]
    assert tool.status == "error" and "city is required" in tool.output
    air = [agl.air.ToolStatus(success=0.1, error=-0.1)]
    ts = agl.transitions(store, air=air, credit=agl.credit.Discounted(1.0))
    assert [round(t.reward, 3) for t in ts] == [-0.1, 0.0]


def test_rows_need_responses_create_params() -> None:
    with pytest.raises(ValueError, match="responses_create_params"):
        agl.envs.NemoGym("http://127.0.0.1:1", data=[{"input": "hi"}])
