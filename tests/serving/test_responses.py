"""``POST /v1/responses`` over real HTTP with the official openai client (Responses API): streaming
events, input items, tools (function, namespace, custom, hosted), structured output, previous
response ids, route forms; every call is one ``llm`` span with token ids, and one transition."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.engines import ScriptedEngine

openai = pytest.importorskip("openai")

LS = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
    "strict": False,
}
CALL = {"tool_calls": [{"name": "exec_command", "arguments": {"cmd": "cat hello.txt"}}]}


def client(llm: agl.serving.LLM) -> Any:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


def llm_spans(store: Any, rollout_id: str) -> list[agl.Span]:
    return [s for s in store.spans(rollout_id) if s.kind == "llm"]


def engine_of(replies: Any, tok: Any) -> ScriptedEngine:
    return ScriptedEngine(replies, tokenizer=tok, model_name="smollm2-135m")


def test_streaming_text_events_and_one_span_with_tokens(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["The secret word is pineapple."], smol_tokenizer), store)
    ro = store.start_rollout("say it", mode="train")
    llm = server.llm(ro.rollout_id, agent="coder")
    stream = client(llm).responses.create(
        model=llm.model,
        input=[
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Be brief."}],
            },
            {"role": "user", "content": "Say the secret word."},
        ],
        stream=True,
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-3:] == ["response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text == final.output_text == "The secret word is pineapple."
    assert final.status == "completed" and final.usage.output_tokens > 0
    (span,) = llm_spans(store, ro.rollout_id)
    assert span.name == "responses" and span.attributes["api"] == "responses"
    assert span.attributes["request_id"] == final.id and span.agent == "coder"
    assert smol_tokenizer.decode(span.response_token_ids, skip_special_tokens=True) == text
    assert span.prompt_token_ids == smol_tokenizer.encode(
        span.attributes["prompt_text"], add_special_tokens=False
    )
    assert "Be brief." in span.attributes["prompt_text"]
    assert len(span.response_logprobs) == len(span.response_token_ids) == final.usage.output_tokens
    (t,) = agl.transitions(store, rollout_ids=[ro.rollout_id])
    assert t.response_token_ids == span.response_token_ids and t.prompt_token_ids == span.prompt_token_ids


def test_tool_round_trip_as_codex_sends_it(serve: Any, store: Any, smol_tokenizer: Any):
    """Codex: developer messages, function tools with ``strict``, ``tool_choice`` auto, streaming;
    the served ``function_call`` item is echoed back with its ``function_call_output``."""
    server = serve(engine_of([CALL, "The secret word is pineapple."], smol_tokenizer), store)
    ro = store.start_rollout("read", mode="train")
    llm = server.llm(ro.rollout_id)
    oa = client(llm)
    history: list[Any] = [
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "You are Codex."}],
        },
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Read hello.txt"}]},
    ]
    common = {
        "model": llm.model,
        "tools": [LS],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "store": False,
    }
    events = list(oa.responses.create(input=history, stream=True, **common))
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    (item,) = events[-1].response.output
    assert item.type == "function_call" and item.name == "exec_command"
    assert json.loads(item.arguments) == {"cmd": "cat hello.txt"}
    history += [
        item.model_dump(exclude_none=True),
        {
            "type": "function_call_output",
            "call_id": item.call_id,
            "output": "The secret word is pineapple.\n",
        },
    ]
    final = oa.responses.create(input=history, **common)
    assert final.output_text == "The secret word is pineapple."
    first, second = llm_spans(store, ro.rollout_id)
    assert first.output["tool_calls"][0]["id"] == item.call_id
    assert second.input[-1] == {
        "role": "tool",
        "tool_call_id": item.call_id,
        "content": "The secret word is pineapple.\n",
    }
    assert "<tool_response>\nThe secret word is pineapple." in second.attributes["prompt_text"]
    assert '"name": "exec_command"' in second.attributes["prompt_text"]  # the earlier call, as text
    ts = agl.transitions(store, rollout_ids=[ro.rollout_id])
    assert [t.response_token_ids for t in ts] == [first.response_token_ids, second.response_token_ids]


def test_namespace_custom_and_hosted_tools(serve: Any, store: Any, smol_tokenizer: Any):
    """namespace tools are flattened, a custom (grammar) tool is a function with one ``input``
    string whose call comes back as a ``custom_tool_call``, hosted tools are left out (noted)."""
    patch = {"tool_calls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}]}
    server = serve(
        engine_of([patch, {"tool_calls": [{"name": "spawn_agent", "arguments": {}}]}], smol_tokenizer), store
    )
    tools = [
        LS,
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "agents",
            "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}],
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Patch files",
            "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
        },
        {"type": "web_search", "external_web_access": True},
        {"type": "tool_search", "execution": "client", "parameters": {}},
    ]
    http = httpx.Client(base_url=server.url)
    r = http.post("/v1/responses", json={"model": "smollm2-135m", "input": "patch it", "tools": tools})
    assert r.status_code == 200, r.text
    (item,) = r.json()["output"]
    assert item["type"] == "custom_tool_call" and item["input"] == "*** Begin Patch"
    r2 = http.post(
        "/v1/responses",
        json={
            "model": "smollm2-135m",
            "input": [
                {"role": "user", "content": "patch it"},
                item,
                {"type": "custom_tool_call_output", "call_id": item["call_id"], "output": "Done!"},
            ],
            "tools": tools,
        },
    )
    assert r2.status_code == 200, r2.text
    assert (
        r2.json()["output"][0]["type"] == "function_call" and r2.json()["output"][0]["name"] == "spawn_agent"
    )
    spans = [s for ro in store.rollouts() for s in store.spans(ro.rollout_id) if s.kind == "llm"]
    assert len(spans) == 2
    for span in spans:
        names = [t["function"]["name"] for t in span.attributes["tools"]]
        assert names == ["exec_command", "spawn_agent", "apply_patch"]
        assert span.attributes["dropped_tools"] == ["web_search", "tool_search"]
        assert "lark grammar" in span.attributes["prompt_text"]
    assert '{"input": "*** Begin Patch"}' in spans[1].attributes["prompt_text"]


def test_instructions_previous_response_id_and_store_false(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["Hi Ann.", "Your name is Ann."], smol_tokenizer), store)
    oa = client(server.llm())
    first = oa.responses.create(model="smollm2-135m", instructions="Be kind.", input="I am Ann.")
    second = oa.responses.create(
        model="smollm2-135m", instructions="Be brief.", input="My name?", previous_response_id=first.id
    )
    assert second.output_text == "Your name is Ann." and second.previous_response_id == first.id
    span = [s for ro in store.rollouts() for s in store.spans(ro.rollout_id) if s.kind == "llm"][-1]
    assert [m["role"] for m in span.input] == ["system", "user", "assistant", "user"]
    assert span.input[0]["content"] == "Be brief." and span.input[2]["content"] == "Hi Ann."
    with pytest.raises(openai.BadRequestError) as err:
        oa.responses.create(model="smollm2-135m", input="x", previous_response_id="resp_unknown")
    assert err.value.body["code"] == "previous_response_not_found"
    unstored = oa.responses.create(model="smollm2-135m", input="x", store=False)
    with pytest.raises(openai.BadRequestError):
        oa.responses.create(model="smollm2-135m", input="y", previous_response_id=unstored.id)


def test_text_format_json_schema_is_the_structured_output_path(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(['{"answer": 4}', "four"], smol_tokenizer), store)
    oa = client(server.llm())
    fmt = {
        "type": "json_schema",
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"answer": {"type": "integer"}},
            "required": ["answer"],
            "additionalProperties": False,
        },
    }
    r = oa.responses.create(model="smollm2-135m", input="2+2?", text={"format": fmt})
    assert json.loads(r.output_text) == {"answer": 4}
    span = next(s for ro in store.rollouts() for s in store.spans(ro.rollout_id) if s.kind == "llm")
    assert span.attributes["response_format"]["type"] == "json_schema"
    with pytest.raises(openai.BadRequestError) as err:  # the script's "four" does not fit the schema
        oa.responses.create(model="smollm2-135m", input="2+2?", text={"format": fmt})
    assert err.value.body["param"] == "response_format"


def test_parallel_tool_calls_false_keeps_one_call_and_tool_choice_named(
    serve: Any, store: Any, smol_tokenizer: Any
):
    two = {
        "tool_calls": [
            {"name": "exec_command", "arguments": {"cmd": "ls"}},
            {"name": "exec_command", "arguments": {"cmd": "pwd"}},
        ]
    }
    server = serve(engine_of([two], smol_tokenizer), store)
    oa = client(server.llm())
    both = oa.responses.create(model="smollm2-135m", input="go", tools=[LS])
    assert [i.type for i in both.output] == ["function_call", "function_call"]
    one = oa.responses.create(
        model="smollm2-135m",
        input="go",
        tools=[LS],
        parallel_tool_calls=False,
        tool_choice={"type": "function", "name": "exec_command"},
    )
    assert [json.loads(i.arguments)["cmd"] for i in one.output] == ["ls"]
    span = [s for ro in store.rollouts() for s in store.spans(ro.rollout_id) if s.kind == "llm"][-1]
    assert 'You must call the function "exec_command".' in span.attributes["prompt_text"]


def test_max_output_tokens_incomplete_and_32000_clamped(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["one two three four five six seven"], smol_tokenizer), store)
    oa = client(server.llm())
    short = oa.responses.create(model="smollm2-135m", input="count", max_output_tokens=2)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 2
    big = oa.responses.create(model="smollm2-135m", input="count", max_output_tokens=32000)
    assert big.status == "completed"
    span = [s for ro in store.rollouts() for s in store.spans(ro.rollout_id) if s.kind == "llm"][-1]
    params = span.attributes["params"]
    assert params["max_tokens_requested"] == 32000
    assert params["max_tokens"] == 8192 - len(span.prompt_token_ids)


def test_every_route_form(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["ok"], smol_tokenizer), store)
    ro = store.start_rollout("t", mode="train")
    rid = ro.rollout_id
    server.rollout_guard = lambda r, leases: (
        None if "L1" in leases else (_ for _ in ()).throw(agl.errors.LeaseError("bad lease"))
    )
    http = httpx.Client(base_url=server.url)
    body = {"model": "smollm2-135m", "input": "hi", "stream": True}
    for path, agent in [
        (f"/rollout/{rid}/lease/L1/v1/responses", None),
        (f"/rollout/{rid}/lease/L1/agent/a2/v1/responses", "a2"),
    ]:
        r = http.post(path, json=body)
        assert r.status_code == 200 and "event: response.completed" in r.text, r.text
        assert llm_spans(store, rid)[-1].agent == agent
    assert http.post(f"/rollout/{rid}/lease/BAD/v1/responses", json=body).status_code == 403
    assert http.post(f"/rollout/{rid}/v1/responses", json=body).status_code == 403  # claimed: lease needed
    server.rollout_guard = None
    r = http.post(f"/rollout/{rid}/agent/a1/v1/responses", json=body)
    assert r.status_code == 200 and llm_spans(store, rid)[-1].agent == "a1"
    r = http.post("/v1/responses", json=body, headers={"x-agl-rollout-id": rid})
    assert r.status_code == 200 and len(llm_spans(store, rid)) == 4
    before = len(store.rollouts(mode="trace"))
    assert http.post("/v1/responses", json=body).status_code == 200  # unrouted: its own trace rollout
    assert len(store.rollouts(mode="trace")) == before + 1


def test_malformed_input_gets_a_400_in_openai_shape(serve: Any, store: Any, smol_tokenizer: Any):
    server = serve(engine_of(["ok"], smol_tokenizer), store)
    http = httpx.Client(base_url=server.url)
    for body, needle in [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input_image",
        ),
        ({"input": [{"type": "bogus"}]}, "bogus"),
        ({"input": 3}, "input"),
        ({"input": "x", "tools": [{"type": "frobnicate"}]}, "frobnicate"),
        ({"input": "x", "temperature": "hot"}, "temperature"),
    ]:
        r = http.post("/v1/responses", json={"model": "smollm2-135m", **body})
        assert r.status_code == 400, (body, r.text)
        assert needle in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"
    assert http.post("/v1/responses", json={"model": "smollm2-135m", "input": "x"}).status_code == 200


def test_every_event_and_response_validates_against_the_sdk_types(
    serve: Any, store: Any, smol_tokenizer: Any
):
    """The raw SSE events and bodies, validated strictly by the openai SDK's pydantic types (a client
    that validates, as the Agents SDK's, would otherwise get plain dicts back)."""
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    patch = {"tool_calls": [{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}]}
    server = serve(engine_of(["one two three four", CALL, patch], smol_tokenizer), store)
    events = TypeAdapter(ResponseStreamEvent)
    tools = [LS, {"type": "custom", "name": "apply_patch"}]
    seen = set()
    for extra in ({"max_output_tokens": 2}, {}, {}):
        for stream in (True, False):
            body = {"model": "smollm2-135m", "input": "x", "stream": stream, "tools": tools, **extra}
            r = httpx.post(f"{server.url}/v1/responses", json=body)
            assert r.status_code == 200, r.text
            if not stream:
                Response.model_validate(r.json())
                continue
            for block in r.text.strip().split("\n\n"):
                name, data = block.split("\n", 1)
                event = json.loads(data.removeprefix("data: "))
                assert name == f"event: {event['type']}"
                events.validate_python(event)
                seen.add(event["type"])
    assert {
        "response.incomplete",
        "response.completed",
        "response.function_call_arguments.done",
        "response.custom_tool_call_input.done",
        "response.output_text.delta",
    } <= seen


def test_codex_request_shape_is_served(serve: Any, store: Any, smol_tokenizer: Any):
    """The body and headers Codex 0.171 sends (docs: harnesses notes), raw over HTTP: every key is
    accepted and the stream ends with ``response.completed`` (Codex reconnects without it)."""
    server = serve(engine_of(["Done."], smol_tokenizer), store, api_key="K")
    body = {
        "model": "smollm2-135m",
        "stream": True,
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are Codex."}],
            },
            {
                "type": "message",
                "id": "msg_2",
                "role": "developer",
                "content": [{"type": "input_text", "text": "Skills."}],
            },
            {
                "type": "message",
                "id": "msg_3",
                "role": "user",
                "content": [{"type": "input_text", "text": "<environment_context>cwd</environment_context>"}],
            },
            {
                "type": "message",
                "id": "msg_4",
                "role": "user",
                "content": [{"type": "input_text", "text": "hi"}],
            },
        ],
        "tools": [LS, {"type": "web_search", "external_web_access": True}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "s1",
        "client_metadata": {"session_id": "s1", "thread_id": "t1", "turn_id": "u1"},
        "text": {"verbosity": "low"},
    }
    headers = {
        "authorization": "Bearer K",
        "accept": "text/event-stream",
        "originator": "codex_exec",
        "session-id": "s1",
        "x-codex-beta-features": "remote_compaction_v2",
    }
    r = httpx.post(f"{server.url}/v1/responses", json=body, headers=headers)
    assert r.status_code == 200, r.text
    kinds = [line.removeprefix("event: ") for line in r.text.splitlines() if line.startswith("event: ")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    (span,) = llm_spans(store, store.rollouts()[0].rollout_id)
    assert span.output == {"role": "assistant", "content": "Done."}
    assert span.attributes["dropped_tools"] == ["web_search"]


def test_a_reasoning_item_goes_with_the_assistant_turn_after_it() -> None:
    from agentlightning_lite.serving.openai_responses import convert_input

    def reasoning(text: str, key: str = "content") -> dict[str, Any]:
        kind = "reasoning_text" if key == "content" else "summary_text"
        return {"type": "reasoning", "id": "rs_1", "summary": [], key: [{"type": kind, "text": text}]}

    call = {"type": "function_call", "call_id": "c1", "name": "ls", "arguments": "{}"}
    out = convert_input([{"role": "user", "content": "q"}, reasoning("Look first."), call])
    assert out[1]["reasoning_content"] == "Look first." and out[1]["tool_calls"][0]["id"] == "c1"
    said = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me see."}],
    }
    out = convert_input([{"role": "user", "content": "q"}, reasoning("Plan.", "summary"), said, call])
    assert (out[1]["content"], out[1]["reasoning_content"], len(out[1]["tool_calls"])) == (
        "Let me see.",
        "Plan.",
        1,
    )
    out = convert_input([{"role": "user", "content": "q"}, said, reasoning("Then call."), call])
    assert out[1]["reasoning_content"] == "Then call."
    out = convert_input(
        [reasoning("Orphan."), {"role": "user", "content": "q"}]
    )  # no assistant turn after it
    assert all("reasoning_content" not in m for m in out)
