"""agl.envs.OpenEnv: replies that make no valid action. The server's field errors in a schema rejection,
``unreadable_reward`` (the episode ends with it, counted), and ``agl-lite train --action-from-reply``
for an action that is not one text field; real OpenEnv servers on 127.0.0.1 (nox -s envs-openenv)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl

pytest.importorskip("openai")
pytest.importorskip(
    "openenv.core", reason="openenv is not installed (the envs-openenv extra; nox -s envs-openenv)"
)

from openenv.core.env_server import Action, Environment, State, create_app

from agentlightning_lite.cli import CLIError, main
from agentlightning_lite.cli.train import env_tasks

from .test_openenv import GuessAction, GuessDigit, GuessObservation, play, serve

MOVE_REPLY = '''
def move(reply):
    """'x y' (two integers) as the Move action."""
    x, y = reply.split()
    return {"x": int(x), "y": int(y)}
'''


class Move(Action):
    x: int
    y: int


class Grid(Environment[Move, GuessObservation, State]):
    """Reach (2, 3): 1.0 and done there, else the distance as a hint."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self._state = State(episode_id=episode_id)
        return GuessObservation(prompt="Reply with two integers x y.")

    def step(self, action: Move, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        if (action.x, action.y) == (2, 3):
            return GuessObservation(prompt="There.", done=True, reward=1.0)
        return GuessObservation(prompt=f"{abs(action.x - 2) + abs(action.y - 3)} away", reward=0.0)

    @property
    def state(self) -> State:
        return self._state


def served(env_cls: type, action_cls: type) -> Iterator[str]:
    server, thread, sock, url = serve(
        create_app(env_cls, action_cls, GuessObservation, max_concurrent_envs=4)
    )
    yield url
    server.should_exit = True
    thread.join(5)
    sock.close()


@pytest.fixture
def grid_url() -> Iterator[str]:
    yield from served(Grid, Move)


@pytest.fixture
def guess_url() -> Iterator[str]:
    yield from served(GuessDigit, GuessAction)


def test_a_schema_rejection_names_the_field_and_the_servers_message(grid_url: str, guess_url: str) -> None:
    env = agl.envs.OpenEnv(grid_url, tasks=[{}], action_from_reply=lambda reply: {"x": reply, "y": 3})
    with pytest.raises(RuntimeError) as err:
        play(env, ["up"], env.tasks[0])
    said = str(err.value)  # not just "Invalid message (code: VALIDATION_ERROR)"
    assert "rejected the action {'x': 'up', 'y': 3}: Invalid message (VALIDATION_ERROR): x: " in said
    assert "valid integer" in said and "(got 'up')" in said and env.rejected_actions == 1
    wrong = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 4}], action_from_reply=lambda reply: {"gues": reply})
    with pytest.raises(RuntimeError, match=r"guess: Field required; gues: Extra inputs are not permitted"):
        play(wrong, ["5"], wrong.tasks[0])


def test_unreadable_replies_end_the_episode_with_the_penalty_and_are_counted(
    grid_url: str, guess_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    def move(reply: str) -> dict[str, int]:
        x, y = reply.split()
        return {"x": int(x), "y": int(y)}

    strict = agl.envs.OpenEnv(grid_url, tasks=[{}], action_from_reply=move)
    with pytest.raises(ValueError, match=r"could not read the reply 'left'.*unreadable_reward="):
        play(strict, ["left"], strict.tasks[0])
    assert strict.unreadable_replies == 0
    env = agl.envs.OpenEnv(grid_url, tasks=[{}], action_from_reply=move, unreadable_reward=-0.5)
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.envs.openenv"):
        reward, store, rid = play(env, ["1 1", "left"], env.tasks[0])  # a move, then no move at all
    assert reward == -0.5 and env.unreadable_replies == 1 and env.rejected_actions == 0
    assert store.get_rollout(rid).status == "succeeded"  # type: ignore[union-attr]
    [signal] = [s for s in store.spans(rid) if s.kind == "signal"]
    assert signal.name == "openenv.unreadable" and signal.status == "error"
    assert "could not read the reply 'left'" in signal.output and signal.attributes["reply"] == "left"
    assert "unreadable_reward=-0.5" in caplog.text
    assert play(env, ["2 3"], env.tasks[0])[0] == 1.0 and env.unreadable_replies == 1  # a readable one
    # an action the environment refuses counts the same way: "five" is no digit for GuessDigit
    guess = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 4}], unreadable_reward=0.0)
    assert play(guess, ["five"], guess.tasks[0])[0] == 0.0
    assert guess.unreadable_replies == 1 and guess.rejected_actions == 1
    with pytest.raises(ValueError, match="unreadable_reward must be a finite number"):
        agl.envs.OpenEnv(guess_url, unreadable_reward=float("nan"))


def test_the_cli_takes_action_from_reply_for_an_action_that_is_not_text(
    grid_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    options: dict[str, Any] = dict(agent=None, data=None, val_data=None, limit=None, env_size=2, seed=0)
    with pytest.raises(CLIError, match=r"fields \['x', 'y'\].*--action-from-reply module:function") as err:
        env_tasks(argparse.Namespace(**options, env=f"openenv:{grid_url}", val_limit=0))
    assert err.value.code == 2
    code = main(["train", "--env", f"openenv:{grid_url}", "--output-dir", str(tmp_path / "out")])
    assert code == 2 and "--action-from-reply module:function" in capsys.readouterr().err
    (tmp_path / "grid_moves.py").write_text(MOVE_REPLY)
    given = dict(action_from_reply=f"{tmp_path / 'grid_moves.py'}:move", unreadable_reward=-1.0)
    agent, tasks, _ = env_tasks(
        argparse.Namespace(**options, **given, env=f"openenv:{grid_url}", val_limit=0)
    )
    assert tasks == [{"seed": 0}, {"seed": 1}] and agent.env.unreadable_reward == -1.0
    assert play(agent.env, ["0 0", "2 3"], tasks[0])[0] == 1.0
    assert play(agent.env, ["north"], tasks[1])[0] == -1.0 and agent.env.unreadable_replies == 1
    with pytest.raises(CLIError, match="has no attribute 'nope'"):
        env_tasks(argparse.Namespace(**options, env=f"openenv:{grid_url}", val_limit=0,
                                     action_from_reply=f"{tmp_path / 'grid_moves.py'}:nope"))  # fmt: skip
    with pytest.raises(CLIError, match=r"--action-from-reply takes module:function"):
        env_tasks(
            argparse.Namespace(**options, env=f"openenv:{grid_url}", val_limit=0, action_from_reply="move")
        )
    with pytest.raises(
        CLIError, match=r"--unreadable-reward applies to --env openenv:URL, not reasoning_gym"
    ):
        env_tasks(argparse.Namespace(**options, env="reasoning_gym:basic_arithmetic", val_limit=0,
                                     unreadable_reward=0.0))  # fmt: skip
