"""The HTTP engine against real servers over real HTTP on 127.0.0.1: the PolicyServer speaking vLLM's
subset (token-id prompts, ``return_token_ids``, logprobs, runtime LoRA loading), with the HF engine
on the tiny random Llama behind it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import BackendError, GenRequest, HTTPEngine

from ..conftest import tiny_hf_engine

pytest.importorskip("peft")

ROOT = Path(__file__).resolve().parents[2]


def _lora(seed: int) -> Any:
    """LoRA settings whose fresh weights are non-zero (so an adapter changes the replies)."""
    import peft
    import torch

    torch.manual_seed(seed)
    return peft.LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)


def save_adapter(path: Path, seed: int, **kw: Any) -> tuple[str, Any]:
    """A peft adapter for the tiny model saved in ``path``; returns it and the HFEngine serving it."""
    import torch

    engine = tiny_hf_engine(lora=_lora(seed), **kw)
    torch.manual_seed(seed)
    with torch.no_grad():  # strong enough to change what the tiny model says
        for name, p in engine.model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.5)
    engine.model.save_pretrained(str(path))
    return str(path), engine


def prompts(engine: Any) -> list[list[int]]:
    return [
        engine.encode(engine.apply_chat_template([{"role": "user", "content": text}]))
        for text in ("hi", "What is 2+2?", "Tell me a story about a dragon.")
    ]


@pytest.fixture
def backend() -> Any:
    """A running PolicyServer (API key ``k``) over a tiny HFEngine; the engine is ``server.engine``."""
    made: list[Any] = []

    def start(**kw: Any) -> PolicyServer:
        engine = tiny_hf_engine(**kw)
        server = PolicyServer(engine, agl.MemoryStore(), api_key="k").start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.stop()
        s.engine.close()


def llm_spans(store: Any, rollout_id: str | None = None) -> list[Any]:
    ids = [rollout_id] if rollout_id else [r.rollout_id for r in store.rollouts()]
    return [s for rid in ids for s in store.spans(rid) if s.kind == "llm"]


def post(server: PolicyServer, path: str, body: dict[str, Any], key: str | None = "k") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


# -- the PolicyServer speaks vLLM's subset -----------------------------------------------------
def test_completions_return_token_ids_and_logprobs_like_vllm(backend: Any) -> None:
    server = backend()
    ids = prompts(server.engine)[1]
    direct = server.engine.generate([GenRequest(prompt_token_ids=ids, max_tokens=6, temperature=0)])[0]
    body = {"prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 0, "return_token_ids": True}
    choice = post(server, "/v1/completions", body).json()["choices"][0]
    assert choice["prompt_token_ids"] == ids
    assert choice["token_ids"] == direct.token_ids
    assert choice["logprobs"]["token_logprobs"] == direct.logprobs
    # tokens named by id (vLLM's return_tokens_as_token_ids)
    choice = post(server, "/v1/completions", body | {"return_tokens_as_token_ids": True}).json()["choices"][0]
    assert choice["logprobs"]["tokens"] == [f"token_id:{t}" for t in direct.token_ids]
    # without the flag, the choice carries no ids (the OpenAI shape)
    assert (
        "token_ids"
        not in post(server, "/v1/completions", body | {"return_token_ids": False}).json()["choices"][0]
    )
    # streaming: the prompt's ids in the first chunk, each chunk its own tokens
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json=body | {"stream": True},
        headers={"Authorization": "Bearer k"},
        timeout=60,
    ) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    got = [c["choices"][0] for c in chunks]
    assert got[0]["prompt_token_ids"] == ids
    assert all("prompt_token_ids" not in c for c in got[1:])
    assert [t for c in got for t in c.get("token_ids", [])] == direct.token_ids


def test_load_and_unload_lora_adapter_like_vllm(backend: Any, tmp_path: Path) -> None:
    server = backend()
    path, lora_engine = save_adapter(tmp_path / "a", seed=1)
    ids = prompts(server.engine)[2]
    want = lora_engine.generate([GenRequest(prompt_token_ids=ids, max_tokens=8, temperature=0)])[0]
    lora_engine.close()
    base = post(
        server,
        "/v1/completions",
        {"prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True},
    )
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path}, key=None).status_code
        == 401
    )
    r = post(server, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a1' added successfully."
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "a1", "lora_path": path}).status_code == 400
    assert post(server, "/v1/load_lora_adapter", {"lora_name": "tiny", "lora_path": path}).status_code == 400
    missing = post(server, "/v1/load_lora_adapter", {"lora_name": "a2", "lora_path": str(tmp_path / "none")})
    assert missing.status_code == 404 and "No adapter found" in missing.json()["error"]["message"]
    body = {
        "model": "a1",
        "prompt": ids,
        "max_tokens": 8,
        "temperature": 0,
        "logprobs": 0,
        "return_token_ids": True,
    }
    choice = post(server, "/v1/completions", body).json()["choices"][0]
    assert choice["token_ids"] == want.token_ids != base.json()["choices"][0]["token_ids"]
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(want.logprobs, abs=1e-5)
    # the base model is still served under its own name
    again = post(
        server,
        "/v1/completions",
        {"prompt": ids, "max_tokens": 8, "temperature": 0, "return_token_ids": True},
    )
    assert again.json()["choices"][0]["token_ids"] == base.json()["choices"][0]["token_ids"]
    r = post(server, "/v1/unload_lora_adapter", {"lora_name": "a1"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'a1' removed successfully."
    assert post(server, "/v1/unload_lora_adapter", {"lora_name": "a1"}).status_code == 404
    assert post(server, "/v1/completions", body).status_code == 404  # the name is gone
    assert server.engine.adapters == []
    assert httpx.get(server.url + "/version").json()["version"] == agl.__version__
    assert httpx.get(server.url + "/health").status_code == 200


# -- the HTTP engine ---------------------------------------------------------------------------
def test_token_ids_and_logprobs_identical_to_the_in_process_engine(backend: Any) -> None:
    server = backend()
    local = tiny_hf_engine()  # the same weights, in this process
    engine = HTTPEngine(server.url, tokenizer=local.tokenizer, api_key="k")
    try:
        assert engine.model_name == "tiny" and engine.health() == {server.url: "ok"}
        greedy = [
            GenRequest(prompt_token_ids=ids, max_tokens=12, temperature=0, top_logprobs=3)
            for ids in prompts(local)
        ]
        sampled = [
            GenRequest(prompt_token_ids=ids, max_tokens=12, temperature=1.0, seed=7) for ids in prompts(local)
        ]
        for req in greedy + sampled:
            ids = req.prompt_token_ids
            got, want = engine.generate([req])[0], local.generate([req])[0]
            assert got.token_ids == want.token_ids
            assert got.logprobs == want.logprobs  # exactly: JSON carries every bit of a float
            assert got.top_logprobs == want.top_logprobs
            assert (got.text, got.finish_reason, got.prompt_token_ids) == (want.text, want.finish_reason, ids)
    finally:
        engine.close()
        local.close()


def test_agents_stream_through_a_policy_server_on_the_http_engine(backend: Any) -> None:
    openai = pytest.importorskip("openai")
    server = backend()
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k")
    store = agl.MemoryStore()
    try:
        with PolicyServer(engine, store) as front:
            ro = store.start_rollout("t")
            llm = front.llm(ro.rollout_id)
            stream = llm.openai_client().chat.completions.create(
                model=llm.model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                temperature=0,
                stream=True,
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        (span,) = llm_spans(store, ro.rollout_id)
        want = server.engine.generate(
            [GenRequest(prompt_token_ids=span.prompt_token_ids, max_tokens=8, temperature=0)]
        )[0]
        assert span.response_token_ids == want.token_ids and span.response_logprobs == want.logprobs
        assert text == want.text and isinstance(openai.__version__, str)
    finally:
        engine.close()


def test_lora_version_switch_while_requests_are_in_flight(backend: Any, tmp_path: Path) -> None:
    server = backend(step_delay_s=0.03, no_eos=True)  # each decoding step 30 ms: a 30-token reply takes ~1 s
    p0, e0 = save_adapter(tmp_path / "v0", seed=1, no_eos=True)
    p1, e1 = save_adapter(tmp_path / "v1", seed=2, no_eos=True)
    ids = prompts(server.engine)[0]
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k", lora=p0)
    try:
        long = engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=30, temperature=0))
        deadline = time.monotonic() + 30
        while "policy-v0" not in server.lora_adapters and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not long.done()
        assert engine.update_weights(p1) == 1
        short = engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=5, temperature=0))
        old, new = long.result(60), short.result(60)
        assert (old.weights_version, old.adapter, new.weights_version, new.adapter) == (
            0,
            "policy",
            1,
            "policy",
        )
        # each finished on its own version's weights
        want_old = e0.generate([GenRequest(prompt_token_ids=ids, max_tokens=30, temperature=0)])[0]
        assert old.token_ids == want_old.token_ids and len(old.token_ids) == 30
        want_new = e1.generate([GenRequest(prompt_token_ids=ids, max_tokens=5, temperature=0)])[0]
        assert new.token_ids == want_new.token_ids != want_old.token_ids[:5]
        spans = llm_spans(server.store)
        assert sorted(s.attributes["adapter"] for s in spans) == ["policy-v0", "policy-v1"]
        # the replaced version is unloaded once its last request is done
        deadline = time.monotonic() + 10
        while list(server.lora_adapters) != ["policy-v1"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(server.lora_adapters) == ["policy-v1"]
        assert server.engine.adapters == ["policy-v1"]
    finally:
        engine.close()
        e0.close()
        e1.close()
