"""agl.SFT: teacher traces through the agent, then teacher-forced updates of the LoRA on their token ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.rl.sft import sft_loss
from agentlightning_lite.serving.engines import ScriptedEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import lora_weights, max_abs_diff

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
        logging_config=LoggingConfig(loggers=[]),
    )
    yield trainer
    trainer.close()
    engine.close()


def test_sft_step_on_teacher_traces_tiny(tiny_trainer: agl.Trainer) -> None:
    check_sft_step(tiny_trainer, [{"q": q} for q in ANSWERS], wrong="5+5?")


def varied(task: dict[str, str], llm: agl.LLM) -> float:
    """Rewards replies sampled at temperature 1 by their distinct characters: a spread in every group."""
    reply = llm.openai_client().chat.completions.create(
        model=llm.model, max_tokens=8, temperature=1.0, messages=[{"role": "user", "content": task["q"]}]
    )
    return len(set(reply.choices[0].message.content or "")) / 8.0


def served_logprob_gap(policy: Any, calls: list[agl.Transition], pad: int) -> float:
    """The largest difference, over the calls' response tokens, between the logprobs the engine served
    and those ``policy`` gives the same tokens now (one forward pass, no gradient)."""
    samples = [Sample(t.prompt_token_ids or [], t.response_token_ids or [], None, 0.0, None) for t in calls]
    batch = collate(samples, pad)
    served = torch.zeros(batch.response_ids.shape)
    for i, t in enumerate(calls):
        served[i, : len(t.response_logprobs or [])] = torch.tensor(t.response_logprobs or [])
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        now, _ = forward_logprobs(policy, batch)
    policy.train(was_training)
    return float(((now - served).abs() * batch.response_mask).max())


def test_sft_then_grpo_on_the_same_adapter(tiny_trainer: agl.Trainer) -> None:
    policy = tiny_trainer.policy
    pad = int(tiny_trainer.engine.pad_token_id or 0)
    tasks = [{"q": q} for q in ANSWERS]
    untrained = lora_weights(policy)
    tiny_trainer.fit(agent, tasks, steps=1)
    warm = lora_weights(policy)
    assert max_abs_diff(untrained, warm) > 1e-3  # SFT trained the adapter
    stats = tiny_trainer.fit(varied, tasks[:2], steps=2, algorithm=agl.GRPO(group_size=2, lr=1e-2))
    assert tiny_trainer.step == 2  # the step count runs on across calls
    assert isinstance(tiny_trainer.algorithm, agl.GRPO)
    assert stats["train/rollouts"] == 8.0  # batch of 4 tasks x group 2, sampled from the policy
    runs = tiny_trainer.store.rollouts(mode="train")
    assert len(runs) == 12  # 4 teacher rollouts, then 8 policy rollouts
    calls = agl.transitions(tiny_trainer.store, mode="train", require_tokens=True)
    assert sorted(t.metadata["model"] for t in calls) == ["scripted"] * 4 + ["tiny"] * 8
    grpo_calls = [t for t in calls if t.metadata["model"] == "tiny"]
    # GRPO updated the same adapter: the same LoRA matrices moved on from where SFT left them ...
    assert "train/skipped_update" not in stats and stats["train/grad_norm"] > 0
    final = lora_weights(policy)
    assert final.keys() == warm.keys() and max_abs_diff(warm, final) > 1e-4
    # ... its rollouts were sampled with the SFT weights (not with a fresh adapter: B = 0 is the base) ...
    with torch.no_grad():
        for n, p in policy.named_parameters():
            if n in warm:
                p.copy_(warm[n])
    assert served_logprob_gap(policy, grpo_calls, pad) < 1e-4
    with policy.disable_adapter():
        assert served_logprob_gap(policy, grpo_calls, pad) > 1e-2
    # ... and the update started from them: its recomputed logprobs were the engine's
    assert stats["train/logprob_mismatch_max"] < 1e-4


def test_sft_rejects_bad_settings(tiny_llama: Any) -> None:
    with pytest.raises(ValueError, match="epochs"):
        agl.SFT(epochs=0)
    with pytest.raises(ValueError, match="KL"):
        agl.SFT(kl_coef=0.1)
    with pytest.raises(TypeError, match=r"agl\.SFT"):
        agl.Trainer(
            algorithm="sft",
            engine=tiny_engine(tiny_llama),
            store=agl.MemoryStore(),
            logging_config=LoggingConfig(loggers=[]),
        )  # type: ignore[arg-type]


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
        logging_config=LoggingConfig(loggers=[]),
    )
    try:
        check_sft_step(trainer, [{"q": q} for q in ANSWERS], wrong=None)
    finally:
        trainer.close()
