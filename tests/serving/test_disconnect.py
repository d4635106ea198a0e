"""A client that disconnects while its request decodes frees its row in the engine's batch
(a real PolicyServer on 127.0.0.1, a real HTTP client, a slow tiny transformers model)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer

httpx = pytest.importorskip("httpx")


def wait_for(cond: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_disconnect_mid_decode_frees_the_engine(tiny_engine: Any, serve: Callable[..., PolicyServer]) -> None:
    engine = tiny_engine(step_delay_s=0.01, no_eos=True)  # 2000 tokens would take 20 s or more
    store = agl.MemoryStore()
    server = serve(engine, store)
    ro = store.start_rollout("q")
    url = server.llm(ro.rollout_id).base_url + "/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}

    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(url, json={**body, "max_tokens": 2000}, timeout=0.5)
    t_gone = time.monotonic()
    assert wait_for(lambda: engine.stats["aborted"] == 1), engine.stats
    assert time.monotonic() - t_gone < 3
    stats = engine.stats
    assert stats["requests"] == 1 and stats["generated_tokens"] < 400, stats  # stopped early

    t0 = time.monotonic()
    reply = httpx.post(url, json={**body, "max_tokens": 5}, timeout=10)
    assert reply.status_code == 200 and time.monotonic() - t0 < 5
    assert reply.json()["usage"]["completion_tokens"] == 5
    # the abandoned call is not recorded (its client never saw a reply); the next one is
    spans = store.spans(ro.rollout_id)
    assert [len(s.response_token_ids or []) for s in spans] == [5]


def test_cancel_rollout_stops_its_requests(tiny_engine: Any, serve: Callable[..., PolicyServer]) -> None:
    engine = tiny_engine(step_delay_s=0.01, no_eos=True, max_batch_size=1)
    server = serve(engine, agl.MemoryStore())
    ro = server.store.start_rollout("q")
    url = server.llm(ro.rollout_id).base_url + "/chat/completions"
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2000}

    import threading

    replies: list[Any] = []
    threads = [
        threading.Thread(target=lambda: replies.append(httpx.post(url, json=body, timeout=30)))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    assert wait_for(lambda: server.rollouts.in_flight(ro.rollout_id) == 2)
    time.sleep(0.2)  # one decoding, one queued behind it (batches of one)
    assert server.cancel_rollout(ro.rollout_id) == 2
    for t in threads:
        t.join(10)
    codes = sorted(r.status_code for r in replies)
    assert codes == [200, 409], [r.text for r in replies]
    done = next(r for r in replies if r.status_code == 200).json()
    assert done["choices"][0]["finish_reason"] == "abort" and done["usage"]["completion_tokens"] < 400
    refused = next(r for r in replies if r.status_code == 409).json()
    assert refused["error"]["code"] == "rollout_cancelled"
    assert server.rollouts.in_flight() == 0
    later = httpx.post(url, json=body, timeout=10)  # the rollout's later calls are refused at once
    assert later.status_code == 409 and later.json()["error"]["code"] == "rollout_cancelled"
    assert engine.stats["requests"] == 1  # the queued one never reached a batch, the later one neither
