"""One GRPO step per model family, on a tiny random-weight model of the family's architecture (Qwen3,
Llama, Mistral, GLM-4.5, DeepSeek-V3 for DeepSeek-V3.1 and Kimi K2, gpt-oss) with a tokenizer that holds
the family's markers and its real chat template.

A random model does not write the family's format, so the engine answers with a given reply (the
family's thinking and tool call, as token ids) and the model's own log-probabilities of it. The server
picks the parsers from the chat template (``auto``), the agent gets the call in ``tool_calls``, and the
step trains on exactly those tokens."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig, SampleConfig
from agentlightning_lite.serving.engines import HFEngine
from agentlightning_lite.serving.engines.base import GenRequest, GenResult

from .._helpers import lora_weights
from ..serving._families import ARGS, BY_NAME, RESULT, TINY, TOOLS, USER, ModelFamily, tiny_model_dir

pytestmark = pytest.mark.slow  # a trainer and one GRPO step per family: 2.5 to 4.5 s each when warm


class ForcedReplyEngine(HFEngine):
    """An :class:`HFEngine` whose every reply is ``reply_ids``, with the model's log-probabilities of
    those tokens under the request's temperature (what it would report had it sampled them)."""

    def __init__(self, model: str, reply_ids: list[int], **kw: Any) -> None:
        super().__init__(model, **kw)
        self.reply_ids = reply_ids

    def _decode(
        self, requests: Sequence[GenRequest], version: int, adapter: str | None = None
    ) -> list[GenResult]:
        out = []
        for r in requests:
            reply = torch.tensor(self.reply_ids)
            ids = torch.tensor([r.prompt_token_ids + self.reply_ids])
            logits = self.model(input_ids=ids).logits[0, len(r.prompt_token_ids) - 1 : -1].float()
            t = r.temperature if r.temperature > 0 else 1.0
            logprobs = torch.log_softmax(logits / t, -1).gather(-1, reply[:, None]).squeeze(-1)
            out.append(
                GenResult(
                    r.prompt_token_ids,
                    list(self.reply_ids),
                    logprobs.tolist(),
                    self.decode(self.reply_ids),
                    "stop",
                    weights_version=version,
                    adapter=adapter,
                )
            )
        return out


@pytest.mark.parametrize("family", TINY, ids=[f.name for f in TINY])
def test_one_grpo_step_on_a_reply_in_the_family_format(family: ModelFamily, tmp_path: Path) -> None:
    model_dir = tiny_model_dir(family, tmp_path / family.name)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    reply_ids = tok.encode(family.reply, add_special_tokens=False)
    specials = {tok.convert_tokens_to_ids(t) for t in family.special + family.plain if t in family.reply}
    assert specials and specials <= set(reply_ids)  # each marker is one token of the reply
    engine = ForcedReplyEngine(
        str(model_dir),
        reply_ids,
        lora=agl.LoRA(r=4, alpha=8, target_modules=list(family.lora_targets)),
        seed=0,
        model_name=family.name,
    )
    seen: list[Any] = []
    turn = itertools.count()

    def agent(task: dict, llm: agl.LLM) -> float:
        # each rollout words its question a little differently: the forced replies are the same tokens, so
        # two identical sequences with opposite advantages would cancel exactly and nothing would train
        k = next(turn)
        question = {**USER, "content": f"{USER['content']} (attempt {k})"}
        r = llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, messages=[question], tools=TOOLS, max_tokens=len(reply_ids) + 8
        )
        message = r.choices[0].message
        seen.append(message)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        return float(calls == [("get_weather", ARGS)]) * (k % 2)  # a reward spread in the group

    trainer = agl.Trainer(
        engine=engine,
        store=agl.MemoryStore(),
        output_dir=tmp_path / "out",
        algorithm=agl.GRPO(group_size=2, lr=5e-3),
        batch_size=1,
        logging_config=LoggingConfig(loggers=[]),
    )
    before = lora_weights(trainer.policy)
    trainer.fit(agent, [{"q": "weather"}], steps=1)
    after = lora_weights(trainer.policy)

    assert len(seen) == 2
    for message in seen:  # the agent saw the call, and the thinking apart from it
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
            ("get_weather", ARGS)
        ]
        assert not (message.content or "").strip()
        assert (message.model_extra or {}).get("reasoning_content") == family.reasoning
    store = trainer.store
    spans = [s for r in store.rollouts(mode="train") for s in store.spans(r.rollout_id) if s.kind == "llm"]
    assert len(spans) == 2
    for span in spans:
        assert span.response_token_ids == reply_ids  # special tokens included, nothing re-tokenised
        assert (span.attributes["tool_parser"], span.attributes["reasoning_parser"]) == (
            family.served_tool_parser,
            family.reasoning_parser,
        )
        prompt = tok.decode(span.prompt_token_ids, skip_special_tokens=False)
        assert prompt.endswith(family.turn_start) and "get_weather" in prompt
    ts = agl.transitions(store, mode="train", require_tokens=True)
    assert sorted(t.reward for t in ts) == [0.0, 1.0]
    assert all(t.response_token_ids == reply_ids for t in ts)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the LoRA weights must move"
    trainer.close()
    engine.close()


class ScriptedTurnsEngine(HFEngine):
    """An :class:`HFEngine` that answers a prompt holding the tool's result with ``answer_ids`` and any
    other with ``call_ids``, with the model's own log-probabilities of those tokens."""

    def __init__(self, model: str, call_ids: list[int], answer_ids: list[int], **kw: Any) -> None:
        super().__init__(model, **kw)
        self.call_ids, self.answer_ids = call_ids, answer_ids

    def _decode(
        self, requests: Sequence[GenRequest], version: int, adapter: str | None = None
    ) -> list[GenResult]:
        out = []
        for r in requests:
            reply_ids = self.answer_ids if RESULT in self.decode(r.prompt_token_ids) else self.call_ids
            ids = torch.tensor([r.prompt_token_ids + reply_ids])
            logits = self.model(input_ids=ids).logits[0, len(r.prompt_token_ids) - 1 : -1].float()
            logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(reply_ids)[:, None]).squeeze(-1)
            out.append(
                GenResult(
                    r.prompt_token_ids,
                    list(reply_ids),
                    logprobs.tolist(),
                    self.decode(reply_ids),
                    "stop",
                    weights_version=version,
                    adapter=adapter,
                )
            )
        return out


@pytest.mark.parametrize("send_back", ["message object", "without reasoning_content"])
def test_qwen3_thinking_tool_loop_merges_in_trajectory_mode_when_the_thinking_comes_back(
    send_back: str, tmp_path: Path
) -> None:
    """Qwen3's template keeps the thinking of the turns after the last user message: an agent that
    appends the returned message object (the OpenAI client sends its ``reasoning_content`` back) gets a
    next prompt that starts with the previous prompt + reply, so the two calls of its tool loop train as
    one sequence; one that drops the thinking splits there, and the split is counted."""
    family = BY_NAME["qwen3"]
    model_dir = tiny_model_dir(family, tmp_path / family.name)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    call_ids = tok.encode(family.reply, add_special_tokens=False)
    answer = "<think>\nIt says sunny.\n</think>\n\nSunny, 24 degrees.<|im_end|>"
    answer_ids = tok.encode(answer, add_special_tokens=False)
    engine = ScriptedTurnsEngine(
        str(model_dir),
        call_ids,
        answer_ids,
        lora=agl.LoRA(r=4, alpha=8, target_modules=list(family.lora_targets)),
        seed=0,
        model_name=family.name,
    )
    turn = itertools.count()
    sent: list[Any] = []

    def agent(task: dict, llm: agl.LLM) -> float:
        client = llm.openai_client(max_retries=0)
        messages: list[Any] = [USER]
        first = client.chat.completions.create(model=llm.model, messages=messages, tools=TOOLS, max_tokens=64)
        message = first.choices[0].message
        assert (message.model_extra or {}).get("reasoning_content") == family.reasoning
        if send_back == "message object":
            messages.append(message)  # what agents do: the SDK serialises its extra fields too
        else:
            messages.append(message.model_dump(exclude_none=True, exclude={"reasoning_content"}))
        (call,) = message.tool_calls or []
        messages.append({"role": "tool", "tool_call_id": call.id, "content": RESULT})
        second = client.chat.completions.create(
            model=llm.model, messages=messages, tools=TOOLS, max_tokens=64
        )
        sent.append(second)
        return float(second.choices[0].message.content == "Sunny, 24 degrees.") * (next(turn) % 2)

    trainer = agl.Trainer(
        engine=engine,
        store=agl.MemoryStore(),
        output_dir=tmp_path / "out",
        algorithm=agl.GRPO(group_size=2, lr=5e-3),
        batch_size=1,
        sample_config=SampleConfig(transitions="trajectory"),
        logging_config=LoggingConfig(loggers=[]),
    )
    metrics = trainer.fit(agent, [{"q": "weather"}], steps=1)
    trainer.close()
    engine.close()

    assert len(sent) == 2
    spans = [
        s
        for r in trainer.store.rollouts(mode="train")
        for s in trainer.store.spans(r.rollout_id)
        if s.kind == "llm"
    ]
    assert len(spans) == 4
    if send_back == "message object":
        assert metrics["trajectory/merged_calls"] == 2.0 and metrics["trajectory/prefix_mismatches"] == 0.0
        assert metrics["trajectory/sequences"] == 2.0  # one per rollout
    else:
        assert metrics["trajectory/merged_calls"] == 0.0 and metrics["trajectory/prefix_mismatches"] == 2.0
        assert metrics["trajectory/sequences"] == 4.0


@pytest.mark.parametrize("family", TINY, ids=[f.name for f in TINY])
def test_shared_prefixes_give_the_plain_logprobs_where_they_are_packed(
    family: ModelFamily, tmp_path: Path
) -> None:
    """The packed update (a group's prompt once, under a block mask) gives each packable family's model the
    logprobs of one sequence per sample; the other architectures are never packed (gpt-oss's sliding
    windows and attention sinks give other logprobs under the mask; DeepSeek-V3's attention refuses it)."""
    import random

    from transformers import AutoModelForCausalLM

    from agentlightning_lite.rl.batching import PACKABLE_MODEL_TYPES, Sample, collate, forward_logprobs, packs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir(family, tmp_path / family.name))
    packable = family.config not in ("DeepseekV3Config", "GptOssConfig")
    assert packs(model) == packable and (model.config.model_type in PACKABLE_MODEL_TYPES) == packable
    if not packable:
        return
    rng = random.Random(0)
    vocab = model.config.vocab_size
    samples = []
    for g in range(2):
        prompt = [rng.randrange(vocab) for _ in range(24)]
        samples += [
            Sample(prompt, [rng.randrange(vocab) for _ in range(3 + k)], None, 0.0, g) for k in range(3)
        ]
    plain = collate(samples, 0)
    packed = collate(samples, 0, share_prefix=True)
    assert packed.packed is not None and packed.model_tokens < plain.model_tokens
    a = forward_logprobs(model, plain)[0].detach() * plain.response_mask
    b = forward_logprobs(model, packed)[0].detach() * plain.response_mask
    torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)
