"""Small requests answer at once under plain asyncio (no uvloop): no wait for the client's delayed ACK."""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine


def _median_ms(http: httpx.Client, send: Any, n: int = 20) -> float:
    send(http)  # warm-up: connection, first-call imports
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = send(http)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
    return 1000 * statistics.median(times)


@pytest.mark.parametrize("loop", ["asyncio", "auto"])
def test_sequential_small_requests_are_fast(serve: Any, loop: str) -> None:
    store = agl.MemoryStore()
    server: PolicyServer = serve(ScriptedEngine(["4"], tokenizer="bytes"), store, loop=loop)
    assert server.uvicorn_config.loop == loop  # the event loop really is the one asked for
    llm = server.llm(store.start_rollout("2+2?").rollout_id)
    body = {"model": llm.model, "messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4}
    with httpx.Client(base_url=llm.base_url, timeout=10) as http:
        chat = _median_ms(http, lambda h: h.post("/chat/completions", json=body))
        models = _median_ms(http, lambda h: h.get("/models"))
    # Before TCP_NODELAY reached the accepted sockets, plain asyncio took about 44 ms a request
    # (the client's delayed ACK); with it, about 1 ms. 20 ms leaves room for a loaded machine.
    assert chat < 20, f"median chat completion {chat:.1f} ms under loop={loop}"
    assert models < 20, f"median GET /v1/models {models:.1f} ms under loop={loop}"
    assert len([s for s in store.spans(llm.rollout_id) if s.kind == "llm"]) == 21


def test_loop_is_checked() -> None:
    with pytest.raises(ValueError, match="loop must be"):
        PolicyServer(ScriptedEngine(["4"], tokenizer="bytes"), loop="trio")
