"""PolicyServer over real HTTP with the real openai client: spans, tokens, tools, streaming, errors."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import httpx
import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine

CALC = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
    },
}
USER = [{"role": "user", "content": "What is 2+2?"}]

pytest.importorskip("httpx")
pytest.importorskip("openai")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


def client(llm: agl.serving.LLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


def llm_spans(store: Any, rollout_id: str) -> list[agl.Span]:
    return [s for s in store.spans(rollout_id) if s.kind == "llm"]


@pytest.fixture
def engine(smol_tokenizer: Any) -> ScriptedEngine:
    return ScriptedEngine(
        ["The answer is 4.", {"tool_calls": [{"name": "calc", "arguments": {"expr": "2+2"}}]}],
        tokenizer=smol_tokenizer,
        model_name="smollm2-135m",
    )


def test_chat_completion_records_exact_tokens(
    serve: Any, store: Any, engine: ScriptedEngine, smol_tokenizer: Any
):
    server = serve(engine, store)
    ro = store.start_rollout("2+2?", mode="train")
    llm = server.llm(ro.rollout_id, agent="solver")
    reply = client(llm).chat.completions.create(
        model=llm.model,
        messages=USER,
        temperature=0.7,
        top_p=0.9,
        max_tokens=50,
        seed=3,
        presence_penalty=0.5,
        extra_body={"top_k": 20},
    )
    assert reply.choices[0].message.content == "The answer is 4."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "smollm2-135m"

    (span,) = llm_spans(store, ro.rollout_id)
    assert span.status == "ok" and span.agent == "solver" and span.model == "smollm2-135m"
    assert span.input == USER
    assert span.output == {"role": "assistant", "content": "The answer is 4."}
    # the prompt tokens are the tokenizer's ids of the rendered chat prompt
    rendered = smol_tokenizer.apply_chat_template(USER, tokenize=False, add_generation_prompt=True)
    assert span.attributes["prompt_text"] == rendered
    assert span.prompt_token_ids == smol_tokenizer.encode(rendered, add_special_tokens=False)
    # the response tokens decode to the reply; the EOS that ended it is kept for training
    assert smol_tokenizer.decode(span.response_token_ids, skip_special_tokens=True) == "The answer is 4."
    assert span.response_token_ids[-1] == smol_tokenizer.eos_token_id
    assert len(span.response_logprobs) == len(span.response_token_ids)
    a = span.attributes
    assert a["policy"] is True and a["server"] == "agl" and a["finish_reason"] == "stop"
    assert a["usage"] == {
        "prompt_tokens": len(span.prompt_token_ids),
        "completion_tokens": len(span.response_token_ids),
        "total_tokens": len(span.prompt_token_ids) + len(span.response_token_ids),
    }
    assert reply.usage.prompt_tokens == len(span.prompt_token_ids)
    assert a["params"]["temperature"] == 0.7 and a["params"]["seed"] == 3
    assert a["params"]["max_tokens"] == 50
    # a training rollout samples untruncated and unpenalised (the distribution the trainer scores) and
    # records what it asked
    asked = {"top_p": 0.9, "top_k": 20, "presence_penalty": 0.5}
    assert a["params"]["top_p"] == 1.0 and a["params"]["truncation_ignored"] == asked
    # the settings that shape the distribution are recorded when set (neutral ones are left out)
    assert "presence_penalty" not in a["params"] and "top_k" not in a["params"]
    assert "frequency_penalty" not in a["params"] and "min_p" not in a["params"]
    assert span.end_time >= span.start_time

    (t,) = agl.transitions(store, rollout_ids=[ro.rollout_id], require_tokens=True)
    assert t.agent == "solver" and t.prompt_token_ids == span.prompt_token_ids
    assert t.response_token_ids == span.response_token_ids and t.response_logprobs == span.response_logprobs


def test_tool_calls_in_openai_structure(serve: Any, store: Any, smol_tokenizer: Any):
    engine = ScriptedEngine(
        [{"tool_calls": [{"name": "calc", "arguments": {"expr": "2+2"}}]}, "It is 4."],
        tokenizer=smol_tokenizer,
    )
    server = serve(engine, store)
    ro = store.start_rollout("2+2?")
    llm = server.llm(ro.rollout_id)
    c = client(llm)
    first = c.chat.completions.create(model=llm.model, messages=USER, tools=[CALC])
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calc" and json.loads(call.function.arguments) == {"expr": "2+2"}

    # the tool's answer goes back in; SmolLM2's template has no tools, so they are in the prompt
    history = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "4"},
    ]
    second = c.chat.completions.create(model=llm.model, messages=history, tools=[CALC])
    assert second.choices[0].message.content == "It is 4." and second.choices[0].message.tool_calls is None

    s1, s2 = llm_spans(store, ro.rollout_id)
    assert s1.output["tool_calls"][0]["function"]["name"] == "calc"
    assert s1.attributes["finish_reason"] == "tool_calls"
    assert s1.attributes["tools"] == [CALC]
    assert "<tools>" in s1.attributes["prompt_text"] and '"name": "calc"' in s1.attributes["prompt_text"]
    decoded = smol_tokenizer.decode(s1.response_token_ids, skip_special_tokens=True)
    assert decoded.startswith("<tool_call>") and '"expr": "2+2"' in decoded
    assert "<tool_response>\n4\n</tool_response>" in s2.attributes["prompt_text"]
    assert "<tool_call>" in s2.attributes["prompt_text"]  # the earlier call, as the model wrote it


def test_tool_choice_none_and_named(serve: Any, store: Any, smol_tokenizer: Any):
    engine = ScriptedEngine(
        [{"tool_calls": [{"name": "calc", "arguments": {"expr": "1"}}]}], tokenizer=smol_tokenizer
    )
    server = serve(engine, store)
    c = client(server.llm())
    r = c.chat.completions.create(model="scripted", messages=USER, tools=[CALC], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content
    r = c.chat.completions.create(
        model="scripted",
        messages=USER,
        tools=[CALC],
        tool_choice={"type": "function", "function": {"name": "calc"}},
    )
    assert r.choices[0].message.tool_calls[0].function.name == "calc"


def test_streaming_reassembles_to_the_same_text(serve: Any, store: Any, smol_tokenizer: Any):
    text = "Héllo wörld — 2+2 is 4. 🙂 Done."
    engine = ScriptedEngine([text], tokenizer=smol_tokenizer)
    server = serve(engine, store)
    ro = store.start_rollout("t")
    llm = server.llm(ro.rollout_id)
    stream = client(llm).chat.completions.create(
        model=llm.model, messages=USER, stream=True, logprobs=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(pieces) == text
    assert len([p for p in pieces if p]) > 3  # really streamed in pieces
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["stop"]
    assert chunks[-1].usage is not None and chunks[-1].choices == []
    streamed_lp = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    (span,) = llm_spans(store, ro.rollout_id)
    assert len(streamed_lp) == len(span.response_token_ids)
    assert chunks[-1].usage.completion_tokens == len(span.response_token_ids)
    assert span.attributes["params"]["stream"] is True
    assert smol_tokenizer.decode(span.response_token_ids, skip_special_tokens=True) == text


def test_streaming_raw_sse_ends_with_done(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    body = {"model": "smollm2-135m", "messages": USER, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    chunk = json.loads(lines[0][6:])
    assert chunk["object"] == "chat.completion.chunk" and chunk["id"].startswith("chatcmpl-")


def test_streaming_tool_calls(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    c = client(server.llm())
    c.chat.completions.create(model="smollm2-135m", messages=USER)  # consume the text reply
    chunks = list(c.chat.completions.create(model="smollm2-135m", messages=USER, tools=[CALC], stream=True))
    calls = [tc for ch in chunks for tc in (ch.choices[0].delta.tool_calls or [])]
    assert len(calls) == 1 and calls[0].index == 0 and calls[0].function.name == "calc"
    assert json.loads(calls[0].function.arguments) == {"expr": "2+2"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_async_client_plain_and_streaming(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    ro = store.start_rollout("t")
    llm = server.llm(ro.rollout_id)

    async def main() -> tuple[str, str]:
        c = openai.AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        r = await c.chat.completions.create(model=llm.model, messages=USER)
        s = await c.chat.completions.create(model=llm.model, messages=USER, tools=[CALC], stream=True)
        names = [tc.function.name async for ch in s for tc in (ch.choices[0].delta.tool_calls or [])]
        await c.close()
        return r.choices[0].message.content, names[0]

    assert asyncio.run(main()) == ("The answer is 4.", "calc")
    assert len(llm_spans(store, ro.rollout_id)) == 2


def test_n_choices_logprobs_and_stop(serve: Any, store: Any, smol_tokenizer: Any):
    replies = iter(["alpha STOP beta", "gamma", "delta"])
    engine = ScriptedEngine(lambda messages: next(replies), tokenizer=smol_tokenizer, logprob=-0.5)
    server = serve(engine, store)
    ro = store.start_rollout("t")
    llm = server.llm(ro.rollout_id)
    r = client(llm).chat.completions.create(
        model=llm.model, messages=USER, n=3, stop=["STOP"], logprobs=True, top_logprobs=2
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.message.content for c in r.choices] == ["alpha ", "gamma", "delta"]
    lp = r.choices[1].logprobs.content
    assert [e.logprob for e in lp] == [-0.5] * len(lp)
    assert "".join(e.token for e in lp) == "gamma<|im_end|>"
    assert lp[0].bytes == list(lp[0].token.encode()) and len(lp[0].top_logprobs) == 1
    spans = llm_spans(store, ro.rollout_id)
    assert len(spans) == 3  # one span per choice: one (prompt, response) pair each
    assert {s.attributes["request_id"] for s in spans} == {r.id}
    assert sorted(s.attributes["choice_index"] for s in spans) == [0, 1, 2]
    assert all(s.attributes["n"] == 3 for s in spans)
    assert len(agl.transitions(store, rollout_ids=[ro.rollout_id], require_tokens=True)) == 3


def test_max_tokens_gives_length(serve: Any, store: Any, engine: ScriptedEngine, smol_tokenizer: Any):
    server = serve(engine, store)
    ro = store.start_rollout("t")
    r = client(server.llm(ro.rollout_id)).chat.completions.create(
        model="smollm2-135m", messages=USER, max_completion_tokens=2
    )
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 2
    (span,) = llm_spans(store, ro.rollout_id)
    assert len(span.response_token_ids) == 2
    assert smol_tokenizer.decode(span.response_token_ids) == r.choices[0].message.content


def test_completions_endpoint(serve: Any, store: Any, smol_tokenizer: Any):
    engine = ScriptedEngine([" world", " there", " again"], tokenizer=smol_tokenizer)
    server = serve(engine, store)
    ro = store.start_rollout("t")
    c = client(server.llm(ro.rollout_id))
    r = c.completions.create(model="scripted", prompt="Hello", logprobs=1, max_tokens=10)
    assert r.object == "text_completion" and r.choices[0].text == " world"
    assert r.choices[0].logprobs.token_logprobs == [0.0] * len(r.choices[0].logprobs.tokens)
    streamed = "".join(
        ch.choices[0].text for ch in c.completions.create(model="scripted", prompt="Hi", stream=True)
    )
    assert streamed == " there"
    r = c.completions.create(model="scripted", prompt=["A", "B"], max_tokens=1)
    assert len(r.choices) == 2 and all(ch.finish_reason == "length" for ch in r.choices)
    spans = llm_spans(store, ro.rollout_id)
    assert [s.input for s in spans] == ["Hello", "Hi", "A", "B"]
    assert spans[0].output == " world"
    assert spans[0].prompt_token_ids == smol_tokenizer.encode("Hello")
    assert smol_tokenizer.decode(spans[0].response_token_ids, skip_special_tokens=True) == " world"


def test_models_endpoint_and_health(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    assert [m.id for m in client(server.llm()).models.list()] == ["smollm2-135m"]
    assert httpx.get(f"{server.url}/health").json()["status"] == "ok"


def _error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(
    serve: Any, store: Any, engine: ScriptedEngine
):
    engine.max_context = 64
    server = serve(engine, store)
    ro = store.start_rollout("t")
    url = server.llm(ro.rollout_id).base_url
    post = lambda path, **kw: httpx.post(url + path, **kw)  # noqa: E731

    assert _error(post("/chat/completions", content=b"{not json"), 400)["code"] == "invalid_json"
    assert _error(post("/chat/completions", json=[1, 2]), 400)["code"] == "invalid_json"
    err = _error(post("/chat/completions", json={"model": "gpt-4o", "messages": USER}), 404)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    err = _error(post("/chat/completions", json={"model": "smollm2-135m"}), 400)
    assert err["param"] == "messages" and err["code"] == "missing_required_parameter"
    assert (
        _error(post("/chat/completions", json={"model": "smollm2-135m", "messages": []}), 400)["param"]
        == "messages"
    )
    bad_role = {"model": "smollm2-135m", "messages": [{"role": "wizard", "content": "hi"}]}
    assert _error(post("/chat/completions", json=bad_role), 400)["param"] == "messages[0]"
    long = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "word " * 200}]}
    err = _error(post("/chat/completions", json=long), 400)
    assert err["code"] == "context_length_exceeded" and "64" in err["message"]
    too_many = {"model": "smollm2-135m", "messages": USER, "max_tokens": 60}
    assert _error(post("/chat/completions", json=too_many), 400)["code"] == "context_length_exceeded"
    for key, value in (
        ("temperature", 5),
        ("n", 0),
        ("max_tokens", "ten"),
        ("top_p", 0),
        ("stream", "yes"),
        ("presence_penalty", 3),
        ("frequency_penalty", "high"),
        ("top_k", -2),
        ("min_p", 1.5),
        ("repetition_penalty", 0),
    ):
        assert (
            _error(
                post("/chat/completions", json={"model": "smollm2-135m", "messages": USER, key: value}), 400
            )["param"]
            == key
        )
    bad_tool = {"model": "smollm2-135m", "messages": USER, "tools": [{"type": "function"}]}
    assert _error(post("/chat/completions", json=bad_tool), 400)["param"] == "tools"
    bad_choice = {
        "model": "smollm2-135m",
        "messages": USER,
        "tools": [CALC],
        "tool_choice": {"type": "function", "function": {"name": "nope"}},
    }
    assert _error(post("/chat/completions", json=bad_choice), 400)["param"] == "tool_choice"
    assert _error(post("/completions", json={"model": "smollm2-135m"}), 400)["param"] == "prompt"
    unknown = f"{server.url}/rollout/no-such-rollout/v1/chat/completions"
    err = _error(httpx.post(unknown, json={"model": "smollm2-135m", "messages": USER}), 404)
    assert err["code"] == "rollout_not_found"
    assert _error(httpx.get(f"{server.url}/v2/nothing"), 404)["code"] == "not_found"
    assert _error(httpx.get(url + "/chat/completions"), 405)["type"] == "invalid_request_error"

    # nothing was recorded for rejected requests, and the server still answers
    assert llm_spans(store, ro.rollout_id) == []
    r = client(server.llm(ro.rollout_id)).chat.completions.create(model="smollm2-135m", messages=USER)
    assert r.choices[0].message.content == "The answer is 4."
    with pytest.raises(openai.NotFoundError) as exc:
        client(server.llm(ro.rollout_id)).chat.completions.create(model="gpt-4o", messages=USER)
    assert exc.value.body["code"] == "model_not_found"


def test_engine_failure_gives_500_and_an_error_span(serve: Any, store: Any, smol_tokenizer: Any):
    engine = ScriptedEngine([RuntimeError("GPU on fire"), "fine"], tokenizer=smol_tokenizer)
    server = serve(engine, store)
    ro = store.start_rollout("t")
    c = client(server.llm(ro.rollout_id))
    with pytest.raises(openai.InternalServerError) as exc:
        c.chat.completions.create(model="scripted", messages=USER)
    assert exc.value.status_code == 500 and "GPU on fire" in exc.value.body["message"]
    assert exc.value.body["type"] == "server_error"
    assert c.chat.completions.create(model="scripted", messages=USER).choices[0].message.content == "fine"
    failed, ok = llm_spans(store, ro.rollout_id)
    assert failed.status == "error" and "GPU on fire" in failed.error and failed.input == USER
    assert failed.response_token_ids is None and failed.attributes["policy"] is True
    assert ok.status == "ok"
    # the failed call has no response: never training data, with or without require_tokens
    for require in (True, False):
        (t,) = agl.transitions(store, rollout_ids=[ro.rollout_id], require_tokens=require)
        assert t.metadata["span_id"] == ok.span_id


def test_api_key(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store, api_key="s3cret")
    ro = store.start_rollout("t")
    llm = server.llm(ro.rollout_id)
    assert llm.api_key == "s3cret"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = httpx.post(
            f"{llm.base_url}/chat/completions",
            json={"model": "smollm2-135m", "messages": USER},
            headers=headers,
        )
        assert _error(r, 401)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=llm.base_url, api_key="wrong", max_retries=0).models.list()
    assert client(llm).chat.completions.create(model=llm.model, messages=USER).choices[0].message.content
    assert len(llm_spans(store, ro.rollout_id)) == 1


def test_concurrent_rollouts_are_routed_by_url(serve: Any, store: Any, smol_tokenizer: Any):
    engine = ScriptedEngine(
        lambda messages: f"echo: {messages[-1]['content']}", tokenizer=smol_tokenizer, delay_s=0.01
    )
    server = serve(engine, store)
    rollouts = [store.start_rollout(f"task-{i}") for i in range(2)]
    errors: list[BaseException] = []

    def agent(i: int) -> None:
        try:
            llm = server.llm(rollouts[i].rollout_id, agent=f"agent{i}")
            c = client(llm)
            for k in range(5):
                r = c.chat.completions.create(
                    model=llm.model, messages=[{"role": "user", "content": f"r{i}-{k}"}]
                )
                assert r.choices[0].message.content == f"echo: r{i}-{k}"
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, ro in enumerate(rollouts):
        spans = llm_spans(store, ro.rollout_id)
        assert [s.input[-1]["content"] for s in spans] == [f"r{i}-{k}" for k in range(5)]
        assert {s.agent for s in spans} == {f"agent{i}"}
        assert [s.output["content"] for s in spans] == [f"echo: r{i}-{k}" for k in range(5)]


def test_agent_from_header_and_model_suffix(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    ro = store.start_rollout("t")
    llm = server.llm(ro.rollout_id)
    c = openai.OpenAI(
        base_url=llm.base_url, api_key="x", default_headers={"X-Agl-Agent": "writer"}, max_retries=0
    )
    c.chat.completions.create(model=llm.model, messages=USER)
    client(llm).chat.completions.create(model="smollm2-135m@checker", messages=USER)
    assert [s.agent for s in llm_spans(store, ro.rollout_id)] == ["writer", "checker"]
    assert [t.agent for t in agl.transitions(store, rollout_ids=[ro.rollout_id], agents=["writer"])] == [
        "writer"
    ]


def test_unrouted_calls_get_an_implicit_trace_rollout(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    c = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    c.chat.completions.create(model="smollm2-135m", messages=USER)
    (ro,) = store.rollouts()
    assert ro.mode == "trace" and ro.status == "succeeded" and ro.metadata["implicit"] is True
    assert ro.task == "What is 2+2?"
    (span,) = llm_spans(store, ro.rollout_id)
    assert span.output["content"] == "The answer is 4." and span.response_token_ids


def test_rollout_header_routes_too(serve: Any, store: Any, engine: ScriptedEngine):
    server = serve(engine, store)
    ro = store.start_rollout("t")
    c = openai.OpenAI(
        base_url=server.base_url, api_key="x", default_headers={"X-Agl-Rollout-Id": ro.rollout_id}
    )
    c.chat.completions.create(model="smollm2-135m", messages=USER)
    assert len(llm_spans(store, ro.rollout_id)) == 1 and len(store.rollouts()) == 1


def test_llm_endpoint_checks_the_rollout(store: Any, engine: ScriptedEngine):
    with PolicyServer(engine, store) as server:
        with pytest.raises(KeyError, match="unknown rollout"):
            server.llm("nope")
        assert server.base_url == f"http://127.0.0.1:{server.port}/v1"
        assert server.llm().base_url == server.base_url
    assert not server.running


def test_sqlite_store_from_another_connection(serve: Any, tmp_path: Any, engine: ScriptedEngine):
    path = tmp_path / "runs.db"
    store = agl.SQLiteStore(path)
    server = serve(engine, store, flush=True)
    ro = store.start_rollout("2+2?", mode="train")
    client(server.llm(ro.rollout_id)).chat.completions.create(model="smollm2-135m", messages=USER)
    reader = agl.SQLiteStore(path)  # what a trainer in another process would open
    (t,) = agl.transitions(reader, rollout_ids=[ro.rollout_id], require_tokens=True)
    assert t.response == {"role": "assistant", "content": "The answer is 4."}
    assert len(t.response_logprobs) == len(t.response_token_ids) > 0
    reader.close()
    store.close()
