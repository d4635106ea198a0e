"""agl.envs.TextArena: real single-player games played by a scripted policy through the PolicyServer."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test

ta = pytest.importorskip("textarena")


def secret(seed: int) -> int:
    env = ta.make("GuessTheNumber-v0")
    env.reset(num_players=1, seed=seed)
    number: int = env.state.game_state["game_number"]
    env.close()
    return number


def direct(game: str, seed: int, move: str) -> tuple[float, int]:
    """The reward TextArena itself gives player 0 for repeating ``move`` until the game ends; the turns."""
    env = ta.make(game)
    env.reset(num_players=1, seed=seed)
    turns, done = 0, False
    while not done:
        done, _ = env.step(move)
        turns += 1
    rewards, _ = env.close()
    return float(rewards[0]), turns


HINT = r"\[Player\] [^\n]*\[(\d+)\]\n\[GAME\] The target number is (higher|lower)"


def bisect(messages: list[dict[str, Any]]) -> str:
    """A policy that plays GuessTheNumber by halving the range the game's hints leave."""
    text = messages[-1]["content"]
    low, high = 1, 20
    for guess, hint in re.findall(
        r"\[Player\] [^\n]*\[(\d+)\]\n\[GAME\] The target number is (higher|lower)", text
    ):
        if hint == "higher":
            low = max(low, int(guess) + 1)
        else:
            high = min(high, int(guess) - 1)
    return f"I guess [{(low + high) // 2}]"


def play(env: agl.envs.TextArena, replies: Any, task: dict[str, Any]) -> tuple[float, agl.MemoryStore]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = env.agent(task, server.llm(ro.id))
            ro.reward(reward)
    rollout = store.get_rollout(ro.id)
    assert rollout is not None and rollout.reward == reward
    return reward, store


def test_a_game_won_over_several_turns() -> None:
    env = agl.envs.TextArena("GuessTheNumber-v0", size=2, seed=3)
    task = env.tasks[0]
    assert (
        json.loads(json.dumps(env.tasks))
        == env.tasks
        == [
            {"game": "GuessTheNumber-v0", "seed": 3},
            {"game": "GuessTheNumber-v0", "seed": 4},
        ]
    )
    reward, store = play(env, bisect, task)
    assert reward == 1.0
    [rollout] = store.rollouts()
    calls = [s for s in store.spans(rollout.rollout_id) if s.kind == "llm"]
    assert 1 < len(calls) <= 5  # bisection finds 1..20 in at most 5 guesses
    assert f"[{secret(3)}]" in json.dumps(calls[-1].output)  # the last guess was the number
    assert [t.final_reward for t in agl.transitions(store)] == [1.0] * len(calls)


def test_a_game_lost_and_a_game_cut_at_max_turns() -> None:
    env = agl.envs.TextArena("GuessTheNumber-v0", size=1, seed=3)
    wrong = 20 if secret(3) != 20 else 19
    lost, store = play(env, [f"[{wrong}]"], env.tasks[0])  # the same wrong guess again and again: lost
    expected, turns = direct("GuessTheNumber-v0", 3, f"[{wrong}]")
    assert lost == expected < 1.0 and len(agl.transitions(store)) == turns > 2
    short = agl.envs.TextArena("GuessTheNumber-v0", size=1, seed=3, max_turns=2)
    cut, store = play(short, [f"[{wrong}]"], short.tasks[0])
    assert cut == 0.0 and len(agl.transitions(store)) == 2


def test_tower_of_hanoi_solved() -> None:
    env = agl.envs.TextArena("TowerOfHanoi-v0", size=1, seed=0)
    moves = ["[A C]", "[A B]", "[C B]", "[A C]", "[B A]", "[B C]", "[A C]"]  # 3 disks, A to C
    reward, store = play(env, moves, env.tasks[0])
    assert reward == 1.0 and len(agl.transitions(store)) == 7


def test_games_that_cannot_run_say_why() -> None:
    with pytest.raises(ValueError, match="no game 'NoSuchGame-v0'"):
        agl.envs.TextArena("NoSuchGame-v0")
    with pytest.raises(ValueError, match="not a single-player game"):
        agl.envs.TextArena("TicTacToe-v0")
