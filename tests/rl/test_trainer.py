"""Trainer.fit: real rollouts over HTTP, real LoRA updates, checkpoints. Two real GRPO steps run on the
embedded model; the plumbing (failures, timeouts, checkpoints, PPO's value head, evaluation) runs on the
tiny Llama with SmolLM2's tokenizer and chat template (the same prompts, a model that answers in
milliseconds)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.config import CheckpointConfig, LoggingConfig, RolloutConfig

from .._helpers import lora_weights

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def embedded() -> Iterator[object]:
    """The embedded model (smollm2-135m) with a LoRA adapter."""
    from agentlightning_lite.serving.engines import HFEngine

    eng = HFEngine("smollm2-135m", lora=agl.LoRA(r=4, alpha=8), seed=0, max_batch_size=16)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def engine(tiny_smol: Path) -> Iterator[object]:
    """The tiny Llama on SmolLM2's tokenizer with a LoRA adapter: for the tests of the plumbing."""
    from agentlightning_lite.serving.engines import HFEngine

    eng = HFEngine(str(tiny_smol), lora=agl.LoRA(r=4, alpha=8), seed=0, max_batch_size=16)
    yield eng
    eng.close()


def chatty_agent(task: dict, llm: agl.LLM) -> float:
    """Rewards longer, more varied replies: a reward with spread, so GRPO has a gradient."""
    reply = llm.openai_client().chat.completions.create(
        model=llm.model,
        max_tokens=8,
        temperature=1.0,
        messages=[{"role": "user", "content": task["q"]}],
    )
    text = reply.choices[0].message.content or ""
    return len(set(text)) / 16.0


TASKS = [{"q": f"Say something about the number {i}.", "seed": i} for i in range(8)]


def make(engine: object, tmp_path: Path, **kw: object) -> agl.Trainer:
    defaults: dict = dict(
        algorithm=agl.GRPO(group_size=4, lr=5e-3), batch_size=2, logging_config=LoggingConfig(loggers=[])
    )
    defaults.update(kw)
    return agl.Trainer(
        engine=engine, store=agl.SQLiteStore(tmp_path / "runs.db"), output_dir=tmp_path, **defaults
    )


def test_two_real_grpo_steps_change_the_lora_weights(embedded: object, tmp_path: Path) -> None:
    engine = embedded
    trainer = make(engine, tmp_path)
    before = lora_weights(trainer.policy)
    version = engine.version  # type: ignore[attr-defined]
    engine.reset_stats()  # type: ignore[attr-defined]
    trainer.fit(chatty_agent, TASKS, steps=2)
    # a step's 8 rollouts run at once (default concurrency) and the engine decodes them as one batch
    assert trainer.rollout_config.concurrency == 8
    assert engine.stats["requests"] == 16 and engine.stats["batches"] == 2  # type: ignore[attr-defined]
    after = lora_weights(trainer.policy)
    changed = [n for n in before if not torch.equal(before[n], after[n])]
    assert len(changed) > len(before) // 2, "most LoRA matrices must move"
    assert engine.version == version + 2  # type: ignore[attr-defined]  # the engine serves the new weights

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
        assert r["train/rollouts"] == 8 and r["train/samples"] == 8
        # the engine's logprobs agree with the training forward pass (same fp32 model)
        assert r["train/logprob_mismatch_mean"] < 1e-3
        # one optimizer step a batch: on-policy, the ratio is taken against the gradient pass's own
        # logprobs (no no-grad pass), which agree with the engine's on every call
        assert r["train/old_logprobs_pass"] == 0.0 and r["train/ratio_from_engine_logprobs"] == 0.0
        assert r["train/old_logprobs_fallback"] == 0.0
        assert r["perf/update_tokens"] < r["perf/plain_tokens"]  # each group's prompt ran once
        # the train/inference mismatch per step: every call checked, ratio quantiles around 1
        assert r["mismatch/kl_k3"] < 1e-6 and r["mismatch/tokens"] == r["train/response_tokens"]
        assert 0.999 < r["mismatch/ratio_p5"] <= r["mismatch/ratio_p50"] <= r["mismatch/ratio_p95"] < 1.001
        assert r["memory/peak_rss_mib"] >= r["memory/rss_mib"] > 50  # this process's real resident size

    # the samples came from the store: 16 train rollouts, each one policy call with exact tokens
    store = trainer.store
    rollouts = store.rollouts(mode="train")
    assert len(rollouts) == 16 and all(r.status == "succeeded" for r in rollouts)
    ts = agl.transitions(store, mode="train", require_tokens=True)
    assert len(ts) == 16
    assert all(t.response_logprobs and len(t.response_logprobs) == len(t.response_token_ids) for t in ts)
    assert {t.metadata["weights_version"] for t in ts} == {version, version + 1}
    assert (tmp_path / "reward_curve.png").stat().st_size > 1000
    trainer.close()


def test_crashes_and_timeouts_do_not_stop_training(tiny_llama: Any, tmp_path: Path) -> None:
    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    # the tiny Llama: its replies take milliseconds, so the rollouts that do not hang finish well within
    # the timeout even on a busy machine
    engine = HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=agl.LoRA(r=4, alpha=8), seed=0)
    release = threading.Event()
    hung: list[threading.Thread] = []

    def agent(task: dict, llm: agl.LLM) -> float:
        if task["seed"] == 1:
            hung.append(threading.current_thread())
            release.wait(60)  # hangs until the test lets it go, long after its timeout
            agl.emit_reward(0.5)
            agl.emit_signal("late", value=1)
            return 1.0
        reward = chatty_agent(task, llm)
        if task["seed"] == 0:
            raise RuntimeError("the agent crashed after its LLM call")
        return reward

    trainer = make(engine, tmp_path, rollout_config=RolloutConfig(timeout=10, failed_reward=0.0))
    trainer.batch_size = 3
    before = lora_weights(trainer.policy)
    out = trainer.fit(agent, [TASKS[0], TASKS[1], TASKS[2]], steps=1)
    statuses = sorted(r.status for r in trainer.store.rollouts())
    assert (
        statuses.count("failed") == 4 and statuses.count("timeout") == 4 and statuses.count("succeeded") == 4
    )
    failed = [r for r in trainer.store.rollouts() if r.status == "failed"]
    assert all(
        r.error == "RuntimeError: the agent crashed after its LLM call" and r.reward == 0.0 for r in failed
    )
    assert out["train/failed_rollouts"] == 4 and out["train/timeout_rollouts"] == 4
    assert out["train/samples"] >= 8  # the failed ones' calls count with reward 0
    assert any(not torch.equal(v, lora_weights(trainer.policy)[k]) for k, v in before.items())

    def timed_out() -> dict[str, Any]:
        store = trainer.store
        return {
            r.rollout_id: (
                r.status,
                r.reward,
                r.error,
                r.end_time,
                [s.span_id for s in store.spans(r.rollout_id)],
            )
            for r in store.rollouts(status="timeout")
        }

    before_late = timed_out()
    assert len(before_late) == 4 and len(hung) == 4
    release.set()  # the timed-out agents finish late: emit, return a reward, leave their rollout
    for thread in hung:
        thread.join(30)
        assert not thread.is_alive(), f"{thread.name} did not finish"
    assert timed_out() == before_late  # what they did after the timeout reached nothing
    trainer.close()
    engine.close()


def test_checkpoint_and_resume(engine: object, tmp_path: Path) -> None:
    first = make(engine, tmp_path, checkpoint_config=CheckpointConfig(save_every=1))
    first.fit(chatty_agent, TASKS, steps=1)
    saved = lora_weights(first.policy)
    cursor = first.data_position
    first.close()
    assert (tmp_path / "checkpoints" / "step-000001" / "adapter" / "adapter_model.safetensors").is_file()

    with torch.no_grad():  # wreck the live weights: resuming must bring the checkpoint back
        for p in first.policy.parameters():
            if p.requires_grad:
                p.add_(1.0)
    second = make(engine, tmp_path, checkpoint_config=CheckpointConfig(save_every=1))
    second.fit(chatty_agent, TASKS, steps=1, resume=True)  # already at step 1: loads, trains nothing
    assert second.step == 1 and second.data_position == cursor
    assert all(torch.equal(saved[n], w) for n, w in lora_weights(second.policy).items())
    assert len(second.optimizer.state) > 0  # AdamW moments restored
    second.fit(chatty_agent, TASKS, steps=2)
    assert second.step == 2
    assert (tmp_path / "checkpoints" / "step-000002").is_dir()
    second.close()


def test_ppo_step_trains_value_head(engine: object, tmp_path: Path) -> None:
    trainer = make(engine, tmp_path, algorithm=agl.PPO(group_size=2, lr=5e-3, epochs=2))
    assert trainer.value_head is not None
    before = trainer.value_head.v.weight.detach().clone()
    out = trainer.fit(chatty_agent, TASKS, steps=1)
    assert not torch.equal(before, trainer.value_head.v.weight)
    assert math.isfinite(out["ppo/value_loss"]) and math.isfinite(out["train/loss"])
    trainer.close()


def test_evaluate_reports_mean_and_success(engine: object, tmp_path: Path) -> None:
    trainer = make(engine, tmp_path)

    def agent(task: int, llm: agl.LLM) -> float:
        if task == 3:
            raise ValueError("bad task")
        return 1.0 if task % 2 == 0 else 0.25

    res = trainer.evaluate(agent, [0, 1, 2, 3])
    assert res == {"mean_reward": pytest.approx((1 + 0.25 + 1) / 3), "success_rate": 0.5, "n": 4, "failed": 1}
    assert {r.mode for r in trainer.store.rollouts()} == {"val"}
    trainer.close()


def test_fit_stops_with_the_first_error_when_every_rollout_fails(engine: object, tmp_path: Path) -> None:
    """An agent that cannot run at all (here: a package it needs is missing) stops fit at the first
    step with that error, instead of running every step on nothing."""

    def agent(task: dict, llm: agl.LLM) -> float:
        raise ModuleNotFoundError("No module named 'openai'")

    trainer = make(engine, tmp_path)
    with pytest.raises(RuntimeError, match="No module named 'openai'") as err:
        trainer.fit(agent, TASKS, steps=3)
    assert "ModuleNotFoundError" in str(err.value) and "max_failed_steps=1" in str(err.value)
    assert str(err.value).startswith("every rollout of step 1 failed or timed out")
    assert trainer.step == 1  # stopped after the first step, not at step 3
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["train/failed_rollouts"]) for r in rows] == [(1, 8.0)]  # the step is logged
    trainer.close()

    # a configurable number of such steps in a row; None never stops
    second = make(engine, tmp_path / "two", rollout_config=RolloutConfig(max_failed_steps=2))
    with pytest.raises(RuntimeError, match=r"2 steps in a row \(steps 1-2\)"):
        second.fit(agent, TASKS, steps=4)
    assert second.step == 2
    second.close()
    never = make(engine, tmp_path / "never", rollout_config=RolloutConfig(max_failed_steps=None))
    out = never.fit(agent, TASKS, steps=2)
    assert never.step == 2 and out["train/failed_rollouts"] == 8
    never.close()
    with pytest.raises(ValueError, match="max_failed_steps"):
        make(engine, tmp_path / "bad", rollout_config=RolloutConfig(max_failed_steps=0))


def test_fit_goes_on_when_only_some_rollouts_fail(engine: object, tmp_path: Path) -> None:
    """Steps where some rollouts fail (even a step where all do, under max_failed_steps=2) train on."""

    def agent(task: dict, llm: agl.LLM) -> float:
        if task["seed"] % 2 == 0 or trainer.step == 0:  # every rollout of step 1 fails, half of the others
            raise ValueError(f"task {task['seed']} failed")
        return chatty_agent(task, llm)

    trainer = make(engine, tmp_path, rollout_config=RolloutConfig(max_failed_steps=2))
    out = trainer.fit(agent, TASKS, steps=3)
    assert trainer.step == 3
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["train/failed_rollouts"] == 8
    assert all(0 < r["train/failed_rollouts"] < 8 for r in rows[1:])
    assert out["train/samples"] > 0
    trainer.close()
