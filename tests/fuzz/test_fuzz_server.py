"""Fuzz the PolicyServer over real HTTP on 127.0.0.1: every hostile request gets a 4xx with an OpenAI
error body (or a 200 when it was valid after all), records nothing when refused, and the server keeps
serving."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine

from .strategies import chat_body, completion_body, hostile_text, json_values

KEY = "sk-fuzz"


@pytest.fixture(scope="module")
def server() -> Iterator[PolicyServer]:
    engine = ScriptedEngine(
        ["4", {"tool_calls": [{"name": "calc", "arguments": {"expr": "2+2"}}]}], tokenizer="bytes",
        max_context=512,
    )  # fmt: skip
    with PolicyServer(engine, agl.MemoryStore(), max_n=4, max_body_bytes=64 * 1024) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server: PolicyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


def _spans(store: agl.Store) -> int:
    return sum(len(store.spans(r.rollout_id)) for r in store.rollouts())


def _check(resp: httpx.Response) -> dict[str, Any] | None:
    """A 2xx, or a 4xx with an OpenAI error body; never a 5xx. Returns the error, if any."""
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        err = resp.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == "invalid_request_error"
        return err
    return None


def _post(client: httpx.Client, path: str, body: Any, **headers: str) -> httpx.Response:
    raw = json.dumps(body).encode()  # NaN/Infinity as JS literals, surrogates \u-escaped
    return client.post(path, content=raw, headers={"content-type": "application/json", **headers})


def _alive(client: httpx.Client) -> None:
    assert client.get("/health").status_code == 200
    ok = _post(client, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert ok.status_code == 200, ok.text


@given(body=chat_body)
def test_chat_bodies(server: PolicyServer, client: httpx.Client, body: dict[str, Any]) -> None:
    before = _spans(server.store)
    resp = _post(client, "/v1/chat/completions", body)
    err = _check(resp)
    if err is not None:
        assert _spans(server.store) == before  # nothing written for a refused request
    elif body.get("stream") is True:
        assert resp.text.rstrip().endswith("data: [DONE]")
    else:
        n = resp.json()["choices"]
        assert len(n) == body.get("n", 1)
        assert _spans(server.store) == before + len(n)


def _prompts(prompt: Any) -> list[Any]:
    """The prompts of an accepted ``/v1/completions`` body: a string or one list of token ids is one."""
    if isinstance(prompt, str) or all(isinstance(x, int) for x in prompt):
        return [prompt]
    return list(prompt)


@given(body=completion_body)
@example(body={"prompt": "2+2=", "n": 2, "max_tokens": 4, "logprobs": 1})
@example(body={"prompt": [[50, 51], [52]], "stream": True, "max_tokens": 3})
def test_completion_bodies(server: PolicyServer, client: httpx.Client, body: dict[str, Any]) -> None:
    before = _spans(server.store)
    resp = _post(client, "/v1/completions", body)
    err = _check(resp)
    if err is not None:
        assert _spans(server.store) == before  # nothing written for a refused request
        event("refused")
        return
    # accepted: n completions of each prompt, each one an llm span
    expected = len(_prompts(body["prompt"])) * body.get("n", 1)
    if body.get("stream") is True:
        assert resp.text.rstrip().endswith("data: [DONE]")
        events = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: {")]
        ends = [c for e in events for c in e["choices"] if c["finish_reason"] is not None]
        assert sorted(c["index"] for c in ends) == list(range(expected))
        event("accepted, streamed")
    else:
        reply = resp.json()
        assert reply["object"] == "text_completion"
        choices = reply["choices"]
        assert [c["index"] for c in choices] == list(range(expected))
        assert all(isinstance(c["text"], str) and c["finish_reason"] in ("stop", "length") for c in choices)
        usage = reply["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        event("accepted")
    assert _spans(server.store) == before + expected


@given(body=json_values)
def test_any_json_document(client: httpx.Client, body: Any) -> None:
    for path in ("/v1/chat/completions", "/v1/completions"):
        _check(_post(client, path, body))


@given(raw=st.binary(max_size=300))
def test_any_bytes(client: httpx.Client, raw: bytes) -> None:
    resp = client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert _check(resp) is not None


@pytest.mark.parametrize("depth", [10, 1_000, 5_000, 30_000])
def test_deep_nesting(client: httpx.Client, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    for raw in (deep, '{"messages": ' + deep + "}", '{"model": "scripted", "tools": ' + deep + "}"):
        _check(client.post("/v1/chat/completions", content=raw.encode()))
    _alive(client)


def test_lone_surrogates_are_refused_and_echoed_escaped(client: httpx.Client) -> None:
    for raw in (
        b'{"model": "x\\ud800y", "messages": []}',
        b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}',
        b'{"prompt": ["ok", "\\udfff"]}',
    ):
        resp = client.post("/v1/chat/completions", content=raw)
        assert resp.status_code == 400, resp.text
        err = resp.json()["error"]
        assert err["code"] == "invalid_unicode" and "lone surrogate \\ud" in err["message"]
    long_name = "m" * 10_000
    resp = _post(client, "/v1/chat/completions", {"model": long_name, "messages": []})
    assert resp.status_code == 404 and len(resp.json()["error"]["message"]) < 500
    _alive(client)


def test_oversized_body(client: httpx.Client) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 70_000}]}
    resp = _post(client, "/v1/chat/completions", body)
    assert resp.status_code == 413
    assert resp.json()["error"]["code"] == "body_too_large"
    _alive(client)


_header = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40).map(str.strip)


@given(rollout=hostile_text, agent=_header)
def test_routing_text(server: PolicyServer, client: httpx.Client, rollout: str, agent: str) -> None:
    from urllib.parse import quote

    body = {"messages": [{"role": "user", "content": "hi"}]}
    safe = rollout.encode("utf-8", "backslashreplace").decode()
    resp = _post(
        client, f"/rollout/{quote(safe, safe='')}/v1/chat/completions", body, **{"x-agl-agent": agent}
    )
    assert _check(resp) is not None and resp.status_code == 404  # no such rollout (or route)
    resp = _post(
        client, "/v1/chat/completions", body, **{"x-agl-rollout-id": quote(safe), "x-agl-agent": agent}
    )
    assert _check(resp) is not None and resp.status_code == 404


def test_streams_cut_off_by_the_client(server: PolicyServer, client: httpx.Client) -> None:
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True, "n": 4}).encode()
    for cut in (0, 10, 200):
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n"
            ).encode()
            sock.sendall(head + body[: len(body) - 5 if cut == 0 else len(body)])  # cut 0: half a body
            if cut:
                sock.recv(cut)
    _alive(client)


@given(auth=st.one_of(st.none(), _header, st.just("Bearer " + KEY), st.just("bearer  " + KEY + "x")))
def test_api_key_is_checked_on_every_route(auth: str | None) -> None:
    global _keyed
    if _keyed is None:
        _keyed = PolicyServer(
            ScriptedEngine(["4"], tokenizer="bytes"), agl.MemoryStore(), api_key=KEY
        ).start()
    headers = {} if auth is None else {"authorization": auth}
    with httpx.Client(base_url=_keyed.url, timeout=30, headers=headers) as c:
        good = (
            auth is not None
            and auth.strip().lower().startswith("bearer ")
            and auth.split(None, 1)[1].strip() == KEY
        )
        for method, path in (
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/completions"),
            ("GET", "/v1/models"),
        ):
            resp = c.request(
                method, path, json={"messages": [{"role": "user", "content": "x"}], "prompt": "x"}
            )
            if good:
                assert resp.status_code == 200, resp.text
            else:
                assert resp.status_code == 401
                assert resp.json()["error"]["code"] == "invalid_api_key"


_keyed: PolicyServer | None = None


def teardown_module() -> None:
    if _keyed is not None:
        _keyed.stop()
