"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` over real HTTP with the official anthropic
client: streaming events, system blocks and mid-conversation system messages, tool_use/tool_result,
auth, errors in Anthropic's shape, max_tokens clamping; every call is one ``llm`` span with token ids,
and one transition."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine

anthropic = pytest.importorskip("anthropic")

READ = {
    "name": "Read",
    "description": "Read a file",
    "input_schema": {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "properties": {"file_path": {"type": "string"}},
        "required": ["file_path"],
        "additionalProperties": False,
    },
}
READ_CALL = {"tool_calls": [{"name": "Read", "arguments": {"file_path": "hello.txt"}}]}
#: Claude Code's headers besides the key
CLAUDE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": (
        "claude-code-20250219,interleaved-thinking-2025-05-14,mid-conversation-system-2026-04-07"
    ),
    "x-app": "cli",
}
#: a ChatML template that, like Qwen's, takes a system message only first
STRICT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def client(server: PolicyServer, rollout_id: str | None = None, **kw: Any) -> Any:
    return server.llm(rollout_id).anthropic_client(max_retries=0, **kw)


def llm_spans(store: Any, rollout_id: str | None = None) -> list[agl.Span]:
    ids = [rollout_id] if rollout_id else [r.rollout_id for r in store.rollouts()]
    return [s for rid in ids for s in store.spans(rid) if s.kind == "llm"]


def engine_of(replies: Any, tok: Any) -> ScriptedEngine:
    return ScriptedEngine(replies, tokenizer=tok, model_name="smollm2-135m")


def test_streaming_events_span_and_transition(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["The secret word is pineapple."], smol_tokenizer), store)
    ro = store.start_rollout("say it", mode="train")
    c = client(server, ro.rollout_id)
    with c.messages.stream(
        model="smollm2-135m",
        max_tokens=32000,  # Claude Code's: more than the context leaves, clamped
        system=[
            {"type": "text", "text": "You are Claude Code."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[{"role": "user", "content": [{"type": "text", "text": "Say the word."}]}],
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_headers=CLAUDE_HEADERS,
    ) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == "The secret word is pineapple."
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0 and final.usage.input_tokens > 0
    (span,) = llm_spans(store, ro.rollout_id)
    assert span.name == "messages" and span.attributes["request_id"] == final.id
    assert span.attributes["params"]["max_tokens_requested"] == 32000
    assert span.attributes["params"]["max_tokens"] == 8192 - len(span.prompt_token_ids)
    assert "You are Claude Code.\nBe brief." in span.attributes["prompt_text"]
    assert len(span.prompt_token_ids) == final.usage.input_tokens
    assert smol_tokenizer.decode(span.response_token_ids, skip_special_tokens=True) == final.content[0].text
    (t,) = agl.transitions(store, rollout_ids=[ro.rollout_id])
    assert t.response_token_ids == span.response_token_ids and t.response_logprobs == span.response_logprobs


def test_tool_use_round_trip_streaming(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of([READ_CALL, "It says pineapple."], smol_tokenizer), store)
    ro = store.start_rollout("read", mode="train")
    c = client(server, ro.rollout_id)
    msgs: list[Any] = [{"role": "user", "content": "Read hello.txt"}]
    with c.messages.stream(model="smollm2-135m", max_tokens=256, tools=[READ], messages=msgs) as stream:
        deltas = [e.delta.type for e in stream if e.type == "content_block_delta"]
        first = stream.get_final_message()
    assert deltas == ["input_json_delta"] and first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "Read" and use.input == {"file_path": "hello.txt"}
    msgs += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": use.id,
                    "content": "1\tThe secret word is pineapple.",
                    "is_error": False,
                }
            ],
        },
    ]
    second = c.messages.create(
        model="smollm2-135m", max_tokens=256, tools=[READ], messages=msgs, stream=False
    )
    assert second.content[0].text == "It says pineapple." and second.stop_reason == "end_turn"
    a, b = llm_spans(store, ro.rollout_id)
    assert a.output["tool_calls"][0]["id"] == use.id
    assert b.input[-1] == {
        "role": "tool",
        "tool_call_id": use.id,
        "content": "1\tThe secret word is pineapple.",
    }
    assert (
        "<tool_response>\n1\tThe secret word is pineapple.\n</tool_response>" in b.attributes["prompt_text"]
    )
    ts = agl.transitions(store, rollout_ids=[ro.rollout_id])
    assert [t.response_token_ids for t in ts] == [a.response_token_ids, b.response_token_ids]


def test_mid_conversation_system_with_smollm2_template(serve: Any, store: Any, smol_tokenizer: Any):
    """SmolLM2's real template renders a later system message in place; a template that refuses
    it (as Qwen's does) gets it merged into the leading system prompt instead of a 400."""
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Agent types: general."},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "bye"},
    ]
    server = serve(engine_of(["ok"], smol_tokenizer), store)
    c = client(server)
    c.messages.create(model="smollm2-135m", max_tokens=16, system="Top.", messages=msgs)
    (span,) = llm_spans(store)
    prompt = span.attributes["prompt_text"]
    assert "<|im_start|>system\nAgent types: general.<|im_end|>" in prompt
    assert prompt.index("hi") < prompt.index("Agent types") < prompt.index("Hello.")
    assert "system_merged" not in span.attributes

    class Strict:
        """SmolLM2's tokenizer with a chat template that refuses a later system message."""

        chat_template = STRICT_TEMPLATE

        def __getattr__(self, name: str) -> Any:
            return getattr(smol_tokenizer, name)

        def apply_chat_template(self, messages: Any, **kw: Any) -> Any:
            return smol_tokenizer.apply_chat_template(messages, chat_template=STRICT_TEMPLATE, **kw)

    strict_store = agl.MemoryStore()
    strict = serve(ScriptedEngine(["ok"], tokenizer=Strict(), model_name="smollm2-135m"), strict_store)
    r = client(strict).messages.create(model="smollm2-135m", max_tokens=16, system="Top.", messages=msgs)
    assert r.content[0].text == "ok"
    (span,) = llm_spans(strict_store)
    assert span.attributes["system_merged"] is True
    assert span.attributes["prompt_text"].startswith(
        "<|im_start|>system\nTop.\n\nAgent types: general.<|im_end|>"
    )
    http = httpx.Client(base_url=strict.url)  # the chat route keeps the template's answer: a 400
    bad = http.post("/v1/chat/completions", json={"model": "smollm2-135m", "messages": msgs})
    assert bad.status_code == 400 and "System message must be at the beginning" in bad.text


def test_auth_headers_beta_query_and_count_tokens(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["ok"], smol_tokenizer), store, api_key="K")
    http = httpx.Client(base_url=server.url)
    body = {"model": "smollm2-135m", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
    r = http.post("/v1/messages?beta=true", json=body, headers={"x-api-key": "K", **CLAUDE_HEADERS})
    assert r.status_code == 200 and r.json()["type"] == "message", r.text
    assert http.post("/v1/messages", json=body, headers={"authorization": "Bearer K"}).status_code == 200
    for headers in ({"x-api-key": "wrong"}, {}):
        r = http.post("/v1/messages", json=body, headers=headers)
        assert r.status_code == 401
        assert r.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": r.json()["error"]["message"]},
        }
    with pytest.raises(anthropic.AuthenticationError):
        server.llm().model_copy(update={"api_key": "wrong"}).anthropic_client(max_retries=0).messages.create(
            **body
        )
    c = server.llm().anthropic_client(max_retries=0)  # the SDK sends x-api-key
    n = c.messages.count_tokens(model="smollm2-135m", system="S", messages=body["messages"], tools=[READ])
    c.messages.create(system="S", tools=[READ], **body)
    span = llm_spans(store)[-1]
    assert n.input_tokens == len(span.prompt_token_ids)
    assert len(llm_spans(store)) == 3  # count_tokens records nothing


def test_errors_in_anthropic_shape_and_the_server_keeps_serving(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["ok"], smol_tokenizer), store)
    c = client(server)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    with pytest.raises(anthropic.BadRequestError) as err:
        c.messages.create(
            model="smollm2-135m",
            max_tokens=16,
            messages=[{"role": "user", "content": [image, {"type": "text", "text": "what?"}]}],
        )
    assert err.value.status_code == 400
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    assert "'image'" in err.value.body["error"]["message"]
    http = httpx.Client(base_url=server.url)
    for body, status in [
        ({"messages": [{"role": "robot", "content": "x"}]}, 400),
        ({"messages": []}, 400),
        ({"messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, 400),
        ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404),
    ]:
        r = http.post("/v1/messages", json={"model": "smollm2-135m", "max_tokens": 8, **body})
        assert r.status_code == status, (body, r.text)
        assert r.json()["type"] == "error" and set(r.json()["error"]) == {"type", "message"}
    assert http.post("/v1/messages", content=b"{not json").json()["type"] == "error"
    ok = c.messages.create(model="smollm2-135m", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert ok.content[0].text == "ok" and len(llm_spans(store)) == 1


def test_stop_sequences_tool_choice_and_max_tokens(serve: Any, store: Any, smol_tokenizer: Any):
    two = {
        "tool_calls": [
            {"name": "Read", "arguments": {"file_path": "a"}},
            {"name": "Read", "arguments": {"file_path": "b"}},
        ]
    }
    server = serve(engine_of(["alpha STOP beta", "one two three four five", two], smol_tokenizer), store)
    c = client(server)
    user = [{"role": "user", "content": "go"}]
    r = c.messages.create(model="smollm2-135m", max_tokens=64, messages=user, stop_sequences=["STOP"])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == "STOP" and r.content[0].text == "alpha "
    r = c.messages.create(model="smollm2-135m", max_tokens=2, messages=user)
    assert r.stop_reason == "max_tokens" and r.usage.output_tokens == 2
    r = c.messages.create(
        model="smollm2-135m",
        max_tokens=64,
        messages=user,
        tools=[READ],
        tool_choice={"type": "tool", "name": "Read", "disable_parallel_tool_use": True},
    )
    assert [b.input for b in r.content] == [{"file_path": "a"}]
    assert 'You must call the function "Read".' in llm_spans(store)[-1].attributes["prompt_text"]


def test_every_route_form(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["ok"], smol_tokenizer), store)
    ro = store.start_rollout("t", mode="train")
    rid = ro.rollout_id
    http = httpx.Client(base_url=server.url)
    body = {
        "model": "smollm2-135m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    for path, agent in [
        (f"/rollout/{rid}/v1/messages?beta=true", None),
        (f"/rollout/{rid}/agent/a1/v1/messages", "a1"),
        (f"/rollout/{rid}/lease/L1/v1/messages", None),
        (f"/rollout/{rid}/lease/L1/agent/a2/v1/messages", "a2"),
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 200 and "event: message_stop" in r.text, (path, r.text)
        assert llm_spans(store, rid)[-1].agent == agent
    r = http.post(f"/rollout/{rid}/v1/messages/count_tokens", json=body)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    r = http.post("/rollout/nope/v1/messages", json=body)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_chat_completions_clamp_is_an_option(serve: Any, store: Any, smol_tokenizer: Any):
    """Chat completions keep OpenAI's 400 by default; ``clamp_max_tokens=True`` clamps there too
    (opencode's default ``max_tokens: 32000``)."""
    body = {"model": "smollm2-135m", "max_tokens": 32000, "messages": [{"role": "user", "content": "hi"}]}
    strict = serve(engine_of(["ok"], smol_tokenizer), store)
    r = httpx.post(f"{strict.base_url}/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    clamping = serve(engine_of(["ok"], smol_tokenizer), store, clamp_max_tokens=True)
    r = httpx.post(f"{clamping.base_url}/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "ok"
    span = llm_spans(store)[-1]
    assert span.attributes["params"]["max_tokens_requested"] == 32000
    r = httpx.post(
        f"{clamping.base_url}/completions",
        json={"model": "smollm2-135m", "prompt": "hi", "max_tokens": 32000},
    )
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == "ok"
    r = httpx.post(
        f"{strict.base_url}/completions", json={"model": "smollm2-135m", "prompt": "hi", "max_tokens": 32000}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    never = serve(engine_of(["ok"], smol_tokenizer), store, clamp_max_tokens=False)
    r = httpx.post(f"{never.url}/v1/messages", json=body)
    assert r.status_code == 400 and r.json()["type"] == "error"


@pytest.fixture(scope="module")
def hf_engine() -> Iterator[Any]:
    pytest.importorskip("torch")
    from agentlightning_lite.serving.engines import HFEngine

    eng = HFEngine("smollm2-135m", seed=0)
    yield eng
    eng.close()


@pytest.mark.slow
def test_real_smollm2_over_messages_and_responses(hf_engine: Any):
    """The embedded model behind both routes: Claude Code's shape (system blocks, a mid-conversation
    system message, tools, streaming) and Codex's (developer items, streaming); exact tokens."""
    store = agl.MemoryStore()
    with PolicyServer(hf_engine, store) as server:
        ro = store.start_rollout("hi", mode="train")
        llm = server.llm(ro.rollout_id)
        with llm.anthropic_client(max_retries=0).messages.stream(
            model=llm.model,
            max_tokens=16,
            system=[{"type": "text", "text": "You are a helpful assistant."}],
            messages=[{"role": "user", "content": "Say hello."}, {"role": "system", "content": "Be brief."}],
            tools=[READ],
        ) as stream:
            message = stream.get_final_message()
        events = list(
            llm.openai_client(max_retries=0).responses.create(
                model=llm.model,
                input=[
                    {"role": "developer", "content": "Be brief."},
                    {"role": "user", "content": "Say hello."},
                ],
                max_output_tokens=12,
                stream=True,
            )
        )
    assert events[-1].type in ("response.completed", "response.incomplete")
    a, b = llm_spans(store, ro.rollout_id)
    assert "<|im_start|>system\nBe brief.<|im_end|>" in a.attributes["prompt_text"]
    assert message.usage.output_tokens == len(a.response_token_ids) > 0
    assert len(b.response_token_ids) == events[-1].response.usage.output_tokens <= 12
    ts = agl.transitions(store, rollout_ids=[ro.rollout_id])
    assert [t.response_token_ids for t in ts] == [a.response_token_ids, b.response_token_ids]
    assert all(len(t.response_logprobs) == len(t.response_token_ids) for t in ts)
    json.dumps([t.model_dump() for t in ts])


def test_every_event_and_message_validates_against_the_sdk_types(serve: Any, store: Any, smol_tokenizer: Any):
    from anthropic.types import Message, RawMessageStreamEvent
    from pydantic import TypeAdapter

    server = serve(engine_of(["one two three", READ_CALL], smol_tokenizer), store)
    events = TypeAdapter(RawMessageStreamEvent)
    seen = set()
    for stream in (True, False, True, False):
        body = {
            "model": "smollm2-135m",
            "max_tokens": 64,
            "stream": stream,
            "tools": [READ],
            "messages": [{"role": "user", "content": "go"}],
        }
        r = httpx.post(f"{server.url}/v1/messages", json=body)
        assert r.status_code == 200, r.text
        if not stream:
            Message.model_validate(r.json())
            continue
        for block in r.text.strip().split("\n\n"):
            name, data = block.split("\n", 1)
            event = json.loads(data.removeprefix("data: "))
            assert name == f"event: {event['type']}"
            events.validate_python(event)
            seen.add(event["type"])
    assert seen == {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    }


def test_claude_code_request_shape_is_served(serve: Any, store: Any, smol_tokenizer: Any):
    """The body and headers Claude Code 2.1 sends (docs: harnesses notes), raw over HTTP: every key it
    sends is accepted, the SSE stream has what it reads, and a failing engine is a 500 in Anthropic's
    shape (Claude Code retries a 500 and exits on a 400)."""
    server = serve(engine_of([READ_CALL, RuntimeError("engine down")], smol_tokenizer), store, api_key="K")
    body = {
        "model": "smollm2-135m",
        "system": [
            {
                "type": "text",
                "text": "x-anthropic-billing-header: cc_version=2.1.197.1c0; cc_entrypoint=sdk-cli;",
            },
            {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "<system-reminder>date</system-reminder>"},
                    {"type": "text", "text": "Read hello.txt", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "system", "content": "Agent types: general-purpose."},
        ],
        "tools": [READ],
        "metadata": {"user_id": json.dumps({"session_id": "s1"})},
        "max_tokens": 32000,
        "thinking": {"type": "adaptive"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"},
        "stream": True,
    }
    headers = {
        **CLAUDE_HEADERS,
        "x-api-key": "K",
        "X-Claude-Code-Session-Id": "s1",
        "anthropic-dangerous-direct-browser-access": "true",
        "accept": "application/json",
    }
    r = httpx.post(f"{server.url}/v1/messages?beta=true", json=body, headers=headers)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = [json.loads(b.split("data: ", 1)[1]) for b in r.text.strip().split("\n\n")]
    assert [e["type"] for e in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[1]["content_block"]["type"] == "tool_use" and events[1]["content_block"]["name"] == "Read"
    assert json.loads(events[2]["delta"]["partial_json"]) == {"file_path": "hello.txt"}
    assert events[4]["delta"]["stop_reason"] == "tool_use"
    failed = httpx.post(f"{server.url}/v1/messages?beta=true", json=body, headers=headers)
    assert failed.status_code == 500
    assert failed.json()["type"] == "error" and failed.json()["error"]["type"] == "api_error"
    ok, bad = llm_spans(store)
    assert ok.status == "ok" and bad.status == "error" and "engine down" in bad.error


def test_an_assistant_thinking_block_is_its_reasoning_content() -> None:
    from agentlightning_lite.serving.anthropic_messages import convert_messages

    out = convert_messages(
        None,
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "Ask the tool.", "signature": ""},
                    {"type": "redacted_thinking", "data": "xyz"},
                    {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
                ],
            },
        ],
    )
    assert out[1]["reasoning_content"] == "Ask the tool." and out[1]["tool_calls"][0]["id"] == "t1"
    assert "reasoning_content" not in convert_messages(None, [{"role": "user", "content": "q"}])[0]
