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
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.serving.engines import HFEngine
from agentlightning_lite.serving.engines.base import GenRequest, GenResult

from .._helpers import lora_weights
from ..serving._families import ARGS, TINY, TOOLS, USER, ModelFamily, tiny_model_dir

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
        r = llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, messages=[USER], tools=TOOLS, max_tokens=len(reply_ids) + 8
        )
        message = r.choices[0].message
        seen.append(message)
        calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]
        return float(calls == [("get_weather", ARGS)]) * (next(turn) % 2)  # a reward spread in the group

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
