"""agl.SFT: teacher traces through the agent, then teacher-forced updates of the LoRA on their token ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.batching import Sample
from agentlightning_lite.rl.sft import sft_loss
from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import lora_weights

ANSWERS = {"2+2?": "four", "3+3?": "six", "5+5?": "ten", "1+1?": "two"}


def agent(task: dict[str, str], llm: agl.LLM) -> float:
    client = llm.openai_client()
    reply = client.chat.completions.create(
        model=llm.model, max_tokens=12, temperature=0.0, messages=[{"role": "user", "content": task["q"]}]
    )
    return float(reply.choices[0].message.content == ANSWERS[task["q"]])


def teacher(tokenizer: Any, wrong: str = "") -> ScriptedEngine:
    """Replies the answer (or ``"nope"`` to the question ``wrong``: an episode that earns 0)."""

    def reply(messages: list[dict[str, Any]]) -> str:
        q = messages[-1]["content"]
        return "nope" if q == wrong else ANSWERS[q]

    return ScriptedEngine(reply, tokenizer=tokenizer)


def tiny_engine(tiny_llama: Any) -> Any:
    from agentlightning_lite.serving.engines import HFEngine

    lora = agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    return HFEngine(
        tiny_llama(max_position_embeddings=1024),
        tokenizer=ByteTokenizer(),
        lora=lora,
        seed=0,
        model_name="tiny",
    )


def recorded_samples(store: agl.Store) -> list[Sample]:
    return [
        Sample(t.prompt_token_ids or [], t.response_token_ids or [], None, t.reward or 0.0, t.rollout_id)
        for t in agl.transitions(store, mode="train", require_tokens=True)
    ]


def check_sft_step(trainer: agl.Trainer, tasks: list[dict[str, str]], wrong: str | None) -> None:
    """One SFT step: the adapter moves and the loss on the recorded teacher calls goes down."""
    start = lora_weights(trainer.policy)
    stats = trainer.fit(agent, tasks, steps=1)
    samples = recorded_samples(trainer.store)
    assert len(samples) == len(tasks)  # one call per rollout, every rollout recorded
    trained = stats["train/sequences"]
    assert trained == len(tasks) - (1 if wrong else 0)  # min_reward=1.0 left the failed episode out
    end = lora_weights(trainer.policy)
    assert any(not torch.equal(start[n], end[n]) for n in start), "the adapter did not change"
    kept = [s for s in samples if s.reward >= 1.0]
    pad = int(trainer.engine.pad_token_id or 0)
    after = sft_loss(trainer.policy, kept, pad)
    with trainer.policy.disable_adapter():  # LoRA starts at B = 0: the base model is the start point
        before = sft_loss(trainer.policy, kept, pad)
    assert after < before - 1e-3, (before, after)
    assert stats["train/loss"] == pytest.approx(before, rel=0.05)  # the step's loss: the start's NLL


@pytest.fixture
def tiny_trainer(tmp_path: Path, tiny_llama: Any) -> Iterator[agl.Trainer]:
    engine = tiny_engine(tiny_llama)
    trainer = agl.Trainer(
        model="tiny",
        engine=engine,
        algorithm=agl.SFT(teacher=teacher(ByteTokenizer(), wrong="5+5?"), lr=3e-2, min_reward=1.0),
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        batch_size=4,
        loggers=[],
    )
    yield trainer
    trainer.close()
    engine.close()


def test_sft_step_on_teacher_traces_tiny(tiny_trainer: agl.Trainer) -> None:
    check_sft_step(tiny_trainer, [{"q": q} for q in ANSWERS], wrong="5+5?")


def test_sft_then_grpo_on_the_same_adapter(tiny_trainer: agl.Trainer) -> None:
    tasks = [{"q": q} for q in ANSWERS]
    tiny_trainer.fit(agent, tasks, steps=1)
    warm = lora_weights(tiny_trainer.policy)
    stats = tiny_trainer.fit(agent, tasks[:2], steps=2, algorithm=agl.GRPO(group_size=2, lr=1e-2))
    assert tiny_trainer.step == 2  # the step count runs on across calls
    assert isinstance(tiny_trainer.algorithm, agl.GRPO)
    assert stats["train/rollouts"] == 8.0  # batch of 4 tasks x group 2, sampled from the policy
    runs = tiny_trainer.store.rollouts(mode="train")
    assert len(runs) == 12  # 4 teacher rollouts, then 8 policy rollouts
    models = {s.model for r in runs for s in tiny_trainer.store.spans(r.rollout_id) if s.kind == "llm"}
    assert models == {"scripted", "tiny"}
    assert lora_weights(tiny_trainer.policy).keys() == warm.keys()


def test_sft_rejects_bad_settings(tiny_llama: Any) -> None:
    with pytest.raises(ValueError, match="epochs"):
        agl.SFT(epochs=0)
    with pytest.raises(ValueError, match="KL"):
        agl.SFT(kl_coef=0.1)
    with pytest.raises(TypeError, match=r"agl\.SFT"):
        agl.Trainer(algorithm="sft", engine=tiny_engine(tiny_llama), store=agl.MemoryStore(), loggers=[])  # type: ignore[arg-type]


@pytest.mark.slow
def test_sft_one_step_on_smollm2(tmp_path: Path) -> None:
    """The embedded model: one SFT step on a handful of teacher traces lowers their loss."""
    trainer = agl.Trainer(
        model="smollm2-135m",
        engine="hf",
        engine_options={"num_threads": 1},
        algorithm=agl.SFT(teacher=teacher("smollm2-135m"), lr=1e-3, min_reward=1.0),
        lora=agl.LoRA(r=8, alpha=16),
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        batch_size=4,
        loggers=[],
    )
    try:
        check_sft_step(trainer, [{"q": q} for q in ANSWERS], wrong=None)
    finally:
        trainer.close()
