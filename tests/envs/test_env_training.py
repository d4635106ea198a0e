"""Environments through the Trainer and the CLI: each rollout's reward is the one the environment gave."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import main
from agentlightning_lite.cli.train import env_tasks

pytest.importorskip("reasoning_gym")
ta = pytest.importorskip("textarena")


def guessing_8(seed: int) -> float:
    """What TextArena itself gives for guessing 8 until GuessTheNumber ends (8 is seed 3's number)."""
    env = ta.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    done = False
    while not done:
        done, _ = env.step("[8]")
    return float(env.close()[0][0])


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_trainer_evaluates_environments(tiny_smol: Path, tmp_path: Path) -> None:
    from agentlightning_lite.rl.config import LoggingConfig
    from agentlightning_lite.serving import engines

    rg = agl.envs.ReasoningGym("basic_arithmetic", size=4, seed=1)
    game = agl.envs.TextArena("GuessTheNumber-v0", size=2, seed=3)
    script = ["<answer>-4</answer>"]  # right for the first arithmetic task only

    def reply(messages: list[dict[str, Any]]) -> str:
        return "[8]" if "Guess The Number" in str(messages) else script[0]

    trainer = agl.Trainer(
        model=str(tiny_smol),
        engine=engines.ScriptedEngine(reply, tokenizer="bytes"),
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
    )
    try:
        summary = trainer.evaluate(rg.agent, rg.tasks)
        assert summary["n"] == 4 and summary["failed"] == 0 and summary["mean_reward"] == 0.25
        rollouts = {r.task["index"]: r for r in trainer.store.rollouts()}
        assert (
            {i: r.reward for i, r in rollouts.items()}
            == {i: rg.reward(rg.tasks[i], script[0]) for i in range(4)}
            == {0: 1.0, 1: 0.0, 2: 0.0, 3: 0.0}
        )
        assert all(r.mode == "val" for r in rollouts.values())
        games = trainer.evaluate(game.agent, game.tasks)
        by_seed = {r.task["seed"]: r.reward for r in trainer.store.rollouts() if "game" in r.task}
        assert games["n"] == 2 and by_seed == {s: guessing_8(s) for s in (3, 4)} and by_seed[3] == 1.0
    finally:
        trainer.close()


def namespace(**kw: Any) -> argparse.Namespace:
    options: dict[str, Any] = dict(agent=None, data=None, val_data=None, val_limit=None, limit=None)
    options.update(env_size=5, seed=0)
    options.update(kw)
    return argparse.Namespace(**options)


def test_cli_env_gives_agent_tasks_and_held_out() -> None:
    agent, tasks, val = env_tasks(namespace(env="reasoning_gym:basic_arithmetic", limit=3, val_limit=2))
    assert isinstance(agent, agl.envs.EnvAgent) and isinstance(agent.env, agl.envs.ReasoningGym)
    assert len(tasks) == 3 and val is not None and len(val) == 2
    assert {t["question"] for t in val}.isdisjoint(t["question"] for t in tasks)  # another seed
    agent, tasks, val = env_tasks(namespace(env="textarena:TowerOfHanoi-v0", env_size=2))
    assert tasks == [{"game": "TowerOfHanoi-v0", "seed": 0}, {"game": "TowerOfHanoi-v0", "seed": 1}]
    assert val is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "gym:CartPole"], "unknown environment kind 'gym'"),
        (["--env", "textarena:NoSuchGame-v0"], "no game 'NoSuchGame-v0'"),
        (["--env", "nemo_gym:http://127.0.0.1:9"], "give them (a JSONL file) as data"),
        (["--env", "reasoning_gym"], "an environment is KIND:NAME"),
        ([], "give AGENT (module:function) or --env KIND:NAME"),
    ],
)
def test_cli_env_usage_errors_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["train", *argv, "--output-dir", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_a_missing_extra_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "reasoning_gym", None)
    with pytest.raises(ImportError, match=r'pip install "agentlightning-lite\[envs-reasoning-gym\]"'):
        agl.envs.ReasoningGym("basic_arithmetic", size=2)
    monkeypatch.setitem(__import__("sys").modules, "textarena", None)
    with pytest.raises(ImportError, match=r'pip install "agentlightning-lite\[envs-textarena\]"'):
        agl.envs.TextArena("GuessTheNumber-v0", size=2)


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_fit_trains_on_an_environment(tiny_engine: Any, tmp_path: Path) -> None:
    from agentlightning_lite.rl.config import LoggingConfig

    env = agl.envs.ReasoningGym("basic_arithmetic", size=4, seed=2, max_tokens=8)
    trainer = agl.Trainer(
        engine=tiny_engine(),
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
    )
    try:
        trainer.fit(env.agent, env.tasks, steps=1)
        rollouts = trainer.store.rollouts(mode="train")
        assert len(rollouts) == 4 and trainer.step == 1
        for rollout in rollouts:
            [call] = [s for s in trainer.store.spans(rollout.rollout_id) if s.kind == "llm"]
            reply = call.output["content"]
            assert isinstance(reply, str) and rollout.reward == env.reward(rollout.task, reply)
    finally:
        trainer.close()
