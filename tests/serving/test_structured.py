"""Structured outputs: ``response_format`` enforced while decoding (HF engine, llguidance masks), checked
for the scripted engine, passed on to vLLM, recorded on the span, and refused with a 400 naming it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.engines import GenRequest, ScriptedEngine
from agentlightning_lite.serving.structured import ResponseFormat, ResponseFormatError, text_fits

pytest.importorskip("llguidance")

# small enough for a random model to finish: an enum, a short string, a small integer
SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "label": {"type": "string", "maxLength": 6},
        "count": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["color", "label", "count"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "pick", "strict": True, "schema": SCHEMA}}
USER = [{"role": "user", "content": "Pick a color."}]


def client(llm: agl.LLM) -> openai.OpenAI:
    return openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)


def llm_spans(store: agl.Store, rollout_id: str) -> list[agl.Span]:
    return [s for s in store.spans(rollout_id) if s.kind == "llm"]


def test_hf_engine_json_schema_replies_validate(serve: Any, store: agl.Store, tiny_engine: Any) -> None:
    server = serve(tiny_engine(), store)
    ro = store.start_rollout("pick", mode="train")
    llm = server.llm(ro.rollout_id, agent="picker")
    reply = client(llm).chat.completions.create(
        model=llm.model, messages=USER, response_format=JSON_SCHEMA, n=3, max_tokens=200, seed=1
    )
    assert len(reply.choices) == 3
    for choice in reply.choices:
        assert choice.finish_reason == "stop"
        doc = json.loads(choice.message.content)
        jsonschema.validate(doc, SCHEMA)
    spans = llm_spans(store, ro.rollout_id)
    assert len(spans) == 3
    for span in spans:
        assert span.attributes["response_format"] == {
            "type": "json_schema",
            "name": "pick",
            "strict": True,
            "schema": SCHEMA,
        }
        # the recorded tokens are the constrained reply: they decode to the JSON the client got
        assert json.loads(server.engine.decode(span.response_token_ids)) == json.loads(span.output["content"])


def test_hf_engine_json_object_and_streaming(serve: Any, tiny_engine: Any) -> None:
    store = agl.MemoryStore()
    server = serve(tiny_engine(), store)
    llm = server.llm(store.start_rollout("x").rollout_id)
    fmt = {"type": "json_object"}
    reply = client(llm).chat.completions.create(
        model=llm.model, messages=USER, response_format=fmt, max_tokens=2000, seed=2
    )
    assert reply.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    stream = client(llm).chat.completions.create(
        model=llm.model, messages=USER, response_format=JSON_SCHEMA, max_tokens=200, stream=True, seed=3
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    jsonschema.validate(json.loads(text), SCHEMA)
    # /v1/completions takes it too
    out = httpx.post(
        llm.base_url + "/completions",
        json={"model": llm.model, "prompt": "Color:", "max_tokens": 200, "response_format": JSON_SCHEMA},
    )
    assert out.status_code == 200, out.text
    jsonschema.validate(json.loads(out.json()["choices"][0]["text"]), SCHEMA)
    assert [
        s.attributes.get("response_format", {}).get("type") for s in llm_spans(store, llm.rollout_id)
    ] == [
        "json_object",
        "json_schema",
        "json_schema",
    ]


def test_hf_engine_masks_only_constrained_rows_and_reports_policy_logprobs(tiny_engine: Any) -> None:
    engine = tiny_engine()
    ids = engine.encode(engine.apply_chat_template(USER))
    fmt = ResponseFormat("json_schema", SCHEMA)
    free, bound = engine.generate(
        [GenRequest(ids, max_tokens=12, seed=5), GenRequest(ids, max_tokens=200, seed=5, response_format=fmt)]
    )
    alone = engine.generate([GenRequest(ids, max_tokens=12, seed=5)])[0]
    assert free.token_ids == alone.token_ids  # the unconstrained row of the batch is untouched
    jsonschema.validate(json.loads(bound.text), SCHEMA)
    # logprobs are the policy's own (no mask), what a trainer recomputes: a forward pass agrees
    import torch

    full = torch.tensor([ids + bound.token_ids])
    with torch.inference_mode():
        logits = engine.model(input_ids=full).logits[0, len(ids) - 1 : -1].float()
    want = torch.log_softmax(logits, -1).gather(-1, torch.tensor(bound.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(bound.logprobs), want, atol=1e-4)
    # a format the engine cannot enforce fails that request only, not the batch it would have joined
    broken = ResponseFormat("json_schema", {"type": "strin"})
    bad = engine.submit(GenRequest(ids, max_tokens=4, response_format=broken))
    good = engine.submit(GenRequest(ids, max_tokens=4))
    with pytest.raises(ResponseFormatError, match="cannot be enforced"):
        bad.result(timeout=30)
    assert len(good.result(timeout=30).token_ids) == 4


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "yaml"}, "'response_format.type' must be"),
        ("json", "'response_format' must be an object"),
        ({"type": "json_schema"}, "'response_format.json_schema' must be an object"),
        ({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema.schema' must be"),
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "cannot be enforced",
        ),
    ],
)
def test_bad_response_format_is_a_400_naming_it(
    serve: Any, tiny_engine: Any, response_format: Any, message: str
) -> None:
    store = agl.MemoryStore()
    server = serve(tiny_engine(), store)
    llm = server.llm(store.start_rollout("x").rollout_id)
    r = httpx.post(
        llm.base_url + "/chat/completions",
        json={"model": llm.model, "messages": USER, "response_format": response_format},
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format" and message in err["message"]
    assert llm_spans(store, llm.rollout_id) == []  # nothing recorded
    ok = client(llm).chat.completions.create(
        model=llm.model, messages=USER, response_format={"type": "text"}, max_tokens=4
    )
    assert ok.choices[0].message.content is not None  # "text" is free text, as before


def test_scripted_engine_replies_when_its_script_fits_and_400_otherwise(serve: Any) -> None:
    store = agl.MemoryStore()
    engine = ScriptedEngine(['{"color": "red", "label": "hi", "count": 3}', "red, hi, 3"], tokenizer="bytes")
    server = serve(engine, store)
    llm = server.llm(store.start_rollout("x").rollout_id)
    reply = client(llm).chat.completions.create(model=llm.model, messages=USER, response_format=JSON_SCHEMA)
    assert json.loads(reply.choices[0].message.content)["color"] == "red"
    with pytest.raises(openai.BadRequestError) as info:
        client(llm).chat.completions.create(model=llm.model, messages=USER, response_format=JSON_SCHEMA)
    body = info.value.body
    assert body["param"] == "response_format" and "does not fit" in body["message"]
    assert len(llm_spans(store, llm.rollout_id)) == 1


def test_an_engine_that_cannot_constrain_answers_400() -> None:
    class Plain(ScriptedEngine):
        check_response_format = agl.serving.engines.Engine.check_response_format

    store = agl.MemoryStore()
    with agl.PolicyServer(Plain(["{}"], tokenizer="bytes"), store) as server:
        llm = server.llm(store.start_rollout("x").rollout_id)
        r = httpx.post(
            llm.base_url + "/chat/completions",
            json={"model": llm.model, "messages": USER, "response_format": {"type": "json_object"}},
        )
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert "cannot constrain" in r.json()["error"]["message"]


def test_with_tools_the_grammar_also_admits_tool_calls() -> None:
    fmt = ResponseFormat("json_schema", SCHEMA)
    call = '<tool_call>\n{"name": "calc", "arguments": {"expr": "2+2"}}\n</tool_call>'
    doc = '{"color": "blue", "label": "", "count": 0}'
    assert text_fits(fmt, doc) and text_fits(fmt, doc, ["calc"])
    assert text_fits(fmt, call, ["calc"]) and not text_fits(fmt, call)
    assert not text_fits(fmt, call.replace("calc", "rm"), ["calc"])  # only the offered tools


@pytest.mark.parametrize("api", ["responses", "chat.completions"])
def test_agents_sdk_structured_output_agent_end_to_end(serve: Any, tiny_engine: Any, api: str) -> None:
    """An Agents SDK agent with ``output_type`` (a pydantic model) on the tiny random model: the SDK
    sends a strict json_schema (``text.format`` on its default Responses model, ``response_format`` on
    Chat Completions) and parses the reply into its model."""
    pytest.importorskip("agents")
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI
    from pydantic import BaseModel, Field

    class Pick(BaseModel):
        color: Literal["red", "green", "blue"]
        label: str = Field(max_length=6)
        count: int = Field(ge=0, le=9)

    store = agl.MemoryStore()
    server = serve(tiny_engine(), store)
    ro = store.start_rollout("pick")
    llm = server.llm(ro.rollout_id, agent="picker")
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    model = kind(
        model=llm.model, openai_client=AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    )
    set_tracing_disabled(True)
    try:
        agent = Agent(name="picker", instructions="Pick a color.", output_type=Pick, model=model)
        result = asyncio.run(Runner.run(agent, "Pick one."))
    finally:
        set_tracing_disabled(False)
    assert isinstance(result.final_output, Pick)
    (span,) = llm_spans(store, ro.rollout_id)
    assert span.agent == "picker" and span.attributes["response_format"]["type"] == "json_schema"
    assert span.attributes["api"] == api
    assert Pick.model_validate_json(span.output["content"]) == result.final_output


def test_langchain_with_structured_output_json_schema(serve: Any, tiny_engine: Any) -> None:
    """LangChain's ``with_structured_output(method="json_schema")`` (what LangGraph's
    ``create_react_agent(response_format=...)`` calls for its final answer) gets a parsed model."""
    pytest.importorskip("langchain_openai")
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    class Pick(BaseModel):
        color: Literal["red", "green", "blue"]
        label: str = Field(max_length=6)
        count: int = Field(ge=0, le=9)

    store = agl.MemoryStore()
    server = serve(tiny_engine(), store)
    llm = server.llm(store.start_rollout("pick").rollout_id)
    chat = ChatOpenAI(
        model=llm.model, base_url=llm.base_url, api_key=llm.api_key, max_retries=0, max_tokens=200
    )
    pick = chat.with_structured_output(Pick, method="json_schema").invoke("Pick a color.")
    assert isinstance(pick, Pick)
    (span,) = llm_spans(store, llm.rollout_id)
    assert span.attributes["response_format"]["name"] == "Pick"
