"""agl.APO as the trainer's algorithm: fit optimises the prompts through the trainer's own rollouts and
store, evaluate and RL use the best prompts afterwards, a later trainer loads them, the policy's own
server can reflect. The policy is the tiny random-init HF engine; the agent's reward depends on its prompt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig

from .helpers import DIGITS, propose_digits, system_of

TRAIN = [{"q": f"{i} + {i}"} for i in range(3)]
VAL = [{"q": f"{i} + 1"} for i in range(10, 12)]


def agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Asks the policy (a traced call); rewarded when its system prompt asks for digits."""
    system = llm.prompt("system", default="You are a helpful assistant.")
    llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model,
        max_tokens=2,
        temperature=1.0,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": task["q"]}],
    )
    return 1.0 if "digits" in system else 0.0


def make(engine: Any, tmp_path: Path, **kw: Any) -> agl.Trainer:
    return agl.Trainer(
        engine=engine, output_dir=tmp_path, logging_config=LoggingConfig(loggers=[]), batch_size=2, **kw
    )


def system_prompts(store: agl.Store, ro: agl.Rollout) -> list[str]:
    return [system_of(s.input) for s in store.spans(ro.rollout_id) if s.kind == "llm"]


@pytest.mark.slow
def test_fit_with_apo_optimises_then_evaluate_and_grpo_use_the_best_prompts(
    tiny_engine: Any, tmp_path: Path
) -> None:
    trainer = make(tiny_engine(), tmp_path, algorithm=agl.APO(reflection=propose_digits, budget=12))
    result = trainer.fit(agent, TRAIN, val_dataset=VAL)
    assert result["apo/seed_val_score"] == 0.0 and result["apo/best_val_score"] == 1.0
    assert trainer.prompts == {"system": DIGITS} == agl.APO.load(tmp_path)
    assert trainer.step == 0  # no weight update
    # every evaluation went through the trainer's store, with the texts it ran with
    evals = [r for r in trainer.store.rollouts() if "apo" in r.metadata]
    assert evals and {r.mode for r in evals} == {"train", "val"}
    for ro in evals:
        assert system_prompts(trainer.store, ro) == [
            ro.metadata["prompts"].get("system", "You are a helpful assistant.")
        ]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["apo/val_score"] for r in rows if r.get("apo/accepted") == 1.0] == [0.0, 1.0]
    # evaluate afterwards: the best prompts
    n = len(trainer.store.rollouts())
    assert trainer.evaluate(agent, VAL)["mean_reward"] == 1.0
    after = trainer.store.rollouts()[n:]
    assert [system_prompts(trainer.store, r) for r in after] == [[DIGITS]] * len(VAL)
    # then RL from them: the rollouts run with the best prompts
    trainer.use_algorithm(agl.GRPO(group_size=2, lr=1e-2))
    trainer.fit(agent, TRAIN, steps=1)
    grpo = [r for r in trainer.store.rollouts() if r.mode == "train" and "apo" not in r.metadata]
    assert len(grpo) == 4 and all(r.metadata["prompts"] == {"system": DIGITS} for r in grpo)
    assert all(system_prompts(trainer.store, r) == [DIGITS] for r in grpo)
    assert trainer.step == 1 and trainer.algorithm.group_size == 2
    trainer.close()


@pytest.mark.slow
def test_a_later_trainer_loads_the_prompts_and_apo_starts_from_them(tiny_engine: Any, tmp_path: Path) -> None:
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"prompts": {"system": "Reply in digits please."}}))
    trainer = make(tiny_engine(), tmp_path / "run", prompts=path)
    assert trainer.prompts == {"system": "Reply in digits please."}
    assert trainer.evaluate(agent, VAL)["mean_reward"] == 1.0
    # an APO run starts from the loaded text, not the default
    seen: list[str] = []

    def reflect(prompt: str) -> str:
        seen.append(prompt)
        return "```\nReply in digits, briefly.\n```"

    result = trainer.fit(agent, TRAIN, val_dataset=VAL, algorithm=agl.APO(reflection=reflect, budget=6))
    assert result["apo/seed_val_score"] == 1.0
    run = json.loads((tmp_path / "run" / "apo" / "latest.json").read_text())["run"]
    first = json.loads((tmp_path / "run" / "apo" / run / "candidates.jsonl").read_text().splitlines()[0])
    assert first["prompts"] == {"system": "Reply in digits please."} and first["parent"] is None
    assert result["prompts"] == {
        "system": "Reply in digits please."
    }  # perfect already: nothing to reflect on
    assert not seen
    trainer.close()


@pytest.mark.slow
def test_the_policy_can_be_its_own_reflection_model(tiny_engine: Any, tmp_path: Path) -> None:
    trainer = make(
        tiny_engine(), tmp_path, algorithm=agl.APO(reflection="policy", budget=8, minibatch_size=2)
    )
    result = trainer.fit(agent, TRAIN, val_dataset=VAL)
    assert result["apo/reflection_calls"] >= 1
    # the reflection request went to the trainer's server and is recorded in its store
    asked = [
        s
        for r in trainer.store.rollouts()
        for s in trainer.store.spans(r.rollout_id)
        if s.kind == "llm" and "I provided an assistant with the following instructions" in str(s.input)
    ]
    assert len(asked) == result["apo/reflection_calls"]
    trainer.close()


def test_apo_and_rl_knobs_are_checked(tiny_engine: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="budget"):
        agl.APO(budget=0)
    with pytest.raises(FileNotFoundError, match="no prompts file"):
        make(tiny_engine(), tmp_path, prompts=tmp_path / "missing.json")
