"""Agents that speak the Responses API (openai) or the Messages API (anthropic) train unchanged: a real
GRPO step on the tiny Llama, from spans the PolicyServer recorded on those routes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig

from .._helpers import lora_weights

pytestmark = pytest.mark.slow

pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


def responses_agent(task: dict, llm: agl.LLM) -> float:
    """A Codex-like caller: developer instructions, streaming Responses events."""
    stream = llm.openai_client(max_retries=0).responses.create(
        model=llm.model,
        input=[{"role": "developer", "content": "Answer."}, {"role": "user", "content": task["q"]}],
        max_output_tokens=8,
        stream=True,
    )
    done = [e for e in stream if e.type in ("response.completed", "response.incomplete")]
    return len(set(done[-1].response.output_text)) / 16.0


def messages_agent(task: dict, llm: agl.LLM) -> float:
    """A Claude-Code-like caller: system blocks, streaming Messages events, a too-large max_tokens."""
    with llm.anthropic_client(max_retries=0).messages.stream(
        model=llm.model,
        max_tokens=32000,
        system=[{"type": "text", "text": "Answer."}],
        messages=[{"role": "user", "content": task["q"]}],
    ) as stream:
        text = "".join(stream.text_stream)
    return len(set(text)) / 16.0


@pytest.mark.parametrize("agent", [responses_agent, messages_agent], ids=["responses", "messages"])
def test_one_grpo_step_from_a_dialect_agent(agent: Any, tiny_llama: Any, tmp_path: Path) -> None:
    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    engine = HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=agl.LoRA(r=4, alpha=8), seed=0)
    engine.max_context = 96  # Claude Code's 32000 is clamped to what the context leaves
    trainer = agl.Trainer(
        engine=engine,
        store=agl.SQLiteStore(tmp_path / "runs.db"),
        output_dir=tmp_path,
        algorithm=agl.GRPO(group_size=4, lr=5e-3),
        batch_size=2,
        logging_config=LoggingConfig(loggers=[]),
    )
    before = lora_weights(trainer.policy)
    tasks = [{"q": f"Say {i}."} for i in range(2)]
    trainer.fit(agent, tasks, steps=1)
    after = lora_weights(trainer.policy)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the LoRA weights must move"
    store = trainer.store
    api = "responses" if agent is responses_agent else "messages"
    rollouts = store.rollouts(mode="train")
    assert len(rollouts) == 8 and all(r.status == "succeeded" for r in rollouts)
    spans = [s for r in rollouts for s in store.spans(r.rollout_id) if s.kind == "llm"]
    assert len(spans) == 8 and {s.attributes["api"] for s in spans} == {api}
    ts = agl.transitions(store, mode="train", require_tokens=True)
    assert len(ts) == 8  # one transition per call, with the served tokens
    assert sorted(t.response_token_ids for t in ts) == sorted(s.response_token_ids for s in spans)
    if api == "messages":
        assert all(s.attributes["params"]["max_tokens_requested"] == 32000 for s in spans)
    trainer.close()
    engine.close()
