"""A step's diagnostics: loud when its rollouts did not call the served policy, and its diversity metrics."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig

pytest.importorskip("torch")

from agentlightning_lite.rl.diagnostics import step_diagnostics
from agentlightning_lite.rl.rollouts import RolloutResult, RolloutSpec
from agentlightning_lite.rl.samples import build_samples

LOGGER = "agentlightning_lite.rl.diagnostics"


def _rollout(store: agl.Store, task_index: int, calls: list[dict]) -> RolloutResult:
    spec = RolloutSpec({"q": task_index}, "train", {"step": 7, "task_index": task_index})
    ro = store.start_rollout(spec.task, mode="train", metadata=spec.metadata)
    spans = []
    for i, c in enumerate(calls):
        served = c.get("served", True)
        ids = c.get("ids", [5, 6, 7])
        spans.append(
            agl.Span(
                span_id=f"{ro.rollout_id}-{i}",
                rollout_id=ro.rollout_id,
                kind="llm",
                name="chat",
                agent=c.get("agent"),
                start_time=ro.start_time,
                end_time=ro.start_time,
                model=c.get("model", "policy"),
                input=[{"role": "user", "content": "q"}],
                output={"role": "assistant", "content": "a"},
                prompt_token_ids=[1, 2] if served else None,
                response_token_ids=ids if served else None,
                response_logprobs=c.get("logprobs", [-0.5] * len(ids)) if served else None,
                attributes={"policy": True, "server": "agl", "adapter": c.get("adapter")} if served else {},
            )
        )
    store.add_spans(spans)
    store.finish_rollout(ro.rollout_id, reward=1.0)
    return RolloutResult(ro.rollout_id, spec, "succeeded", 1.0, None, 0.1)


def test_no_call_to_the_served_policy_is_reported_at_once(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.MemoryStore()
    results = [_rollout(store, 0, [{"served": False, "model": "gpt-4o-mini"}]) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        samples, stats = build_samples(results, store, version=0)  # what the trainer calls after rollouts
    assert samples == []
    assert stats["diag/policy_calls"] == 0.0 and stats["diag/other_calls"] == 2.0
    [record] = [r for r in caplog.records if r.name == LOGGER]
    assert record.levelno == logging.WARNING
    assert "step 7: the 2 rollouts made 2 LLM calls, none to the served policy" in record.getMessage()
    assert "'gpt-4o-mini' (2)" in record.getMessage() and "base_url=llm.base_url" in record.getMessage()


def test_no_call_at_all_and_some_calls_elsewhere(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.MemoryStore()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step_diagnostics([_rollout(store, 0, [])], store)
    assert "made no LLM call that was recorded" in caplog.text and "`llm` argument" in caplog.text
    caplog.clear()
    mixed = [_rollout(store, 1, [{}, {"served": False, "model": "claude"}])]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        stats = step_diagnostics(mixed, store)
    assert "1 of 2 LLM calls did not go to the served policy ('claude' (1))" in caplog.text
    assert stats["diag/policy_calls"] == 1.0 and stats["diag/other_calls"] == 1.0


def test_an_agent_served_without_its_adapter(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.MemoryStore()
    results = [
        _rollout(store, 0, [{"agent": "writer", "adapter": None}, {"agent": "checker", "adapter": "checker"}])
    ]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        step_diagnostics(results, store, {"writer": "writer", "checker": "checker"})
    assert (
        "1 calls of agent 'writer' were served by the base model, not by its adapter 'writer'" in caplog.text
    )
    assert "checker" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):  # one shared policy: the base serving it is normal
        step_diagnostics(results, store, {"writer": "default", "checker": "default"})
    assert caplog.text == ""


def test_entropy_and_diversity() -> None:
    store = agl.MemoryStore()
    same = [
        _rollout(store, 0, [{"ids": [5, 6, 5, 6], "logprobs": [-1.0, -0.5, -0.25, -0.25]}]) for _ in range(2)
    ]
    varied = [_rollout(store, 1, [{"ids": [9, 9, 9, 9]}]), _rollout(store, 1, [{"ids": [3]}])]
    stats = step_diagnostics(same + varied, store)
    assert stats["diag/distinct_responses"] == pytest.approx((1 / 2 + 2 / 2) / 2)  # task 0 alike, task 1 not
    # bigrams: (5,6),(6,5),(5,6) twice over, then (9,9) x3: 3 distinct of 9
    assert stats["diag/distinct_2"] == pytest.approx(3 / 9)
    logprobs = [-1.0, -0.5, -0.25, -0.25] * 2 + [-0.5] * 5
    assert stats["diag/entropy"] == pytest.approx(-sum(logprobs) / len(logprobs))


def _ignores_its_llm(task: dict, llm: agl.LLM) -> float:
    return 1.0 if task["i"] % 2 else 0.0  # answers without calling the model it is given


def _calls_its_llm(task: dict, llm: agl.LLM) -> float:
    reply = llm.openai_client().chat.completions.create(
        model=llm.model,
        max_tokens=4,
        temperature=1.0,
        messages=[{"role": "user", "content": f"hi {task['i']}"}],
    )
    return len(reply.choices[0].message.content or "") / 4.0


@pytest.mark.slow
def test_the_trainer_says_at_once_when_no_call_reached_the_policy(
    tiny_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("openai")
    trainer = agl.Trainer(
        engine=tiny_engine(lora=agl.LoRA(r=2, alpha=4)),
        store=agl.SQLiteStore(tmp_path / "runs.db"),
        output_dir=tmp_path,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        logging_config=LoggingConfig(loggers=[]),
    )
    tasks = [{"i": i} for i in range(4)]
    with trainer, caplog.at_level(logging.WARNING, logger=LOGGER):
        trainer.fit(_ignores_its_llm, tasks, steps=1)
        warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
        assert len(warned) == 1 and warned[0].startswith("step 0: the 4 rollouts made no LLM call")
        caplog.clear()
        trainer.fit(_calls_its_llm, tasks, steps=2)
        assert [r for r in caplog.records if r.name == LOGGER] == []  # the served policy was called
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "diag/policy_calls" in r]
    assert [r["diag/policy_calls"] for r in steps] == [0.0, 4.0]
    assert steps[1]["diag/entropy"] > 0 and 0 < steps[1]["diag/distinct_2"] <= 1
