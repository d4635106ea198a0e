"""agl.envs.OpenEnv: real OpenEnv environments served by uvicorn on 127.0.0.1, played by a scripted
policy through the PolicyServer (nox -s envs-openenv installs the extra alone and runs these)."""

from __future__ import annotations

import argparse
import json
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import agentlightning_lite as agl

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test
pytest.importorskip(
    "openenv.core", reason="openenv is not installed (the envs-openenv extra; nox -s envs-openenv)"
)
uvicorn = pytest.importorskip("uvicorn")

from fastmcp import FastMCP  # noqa: E402
from openenv.core.env_server import (  # noqa: E402
    Action,
    CallToolAction,
    Environment,
    MCPEnvironment,
    Observation,
    State,
    create_app,
)

from agentlightning_lite.cli.train import env_tasks  # noqa: E402
from agentlightning_lite.serving import PolicyServer, engines  # noqa: E402


class GuessAction(Action):
    guess: str


class GuessObservation(Observation):
    prompt: str = ""


class GuessDigit(Environment[GuessAction, GuessObservation, State]):
    """Guess the digit ``seed % 10``: -0.1 and a hint per wrong guess, 1.0 and done when right; a
    guess that is not a digit is an error (the action is refused)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self.target, self._state = 0, State()

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> GuessObservation:
        self.target, self._state = (seed or 0) % 10, State(episode_id=episode_id)
        return GuessObservation(prompt="Guess a digit from 0 to 9.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        if not action.guess.strip().isdigit():
            raise ValueError(f"not a digit: {action.guess!r}")
        guess = int(action.guess)
        if guess == self.target:
            return GuessObservation(prompt="Right.", done=True, reward=1.0)
        return GuessObservation(prompt="higher" if guess < self.target else "lower", reward=-0.1)

    @property
    def state(self) -> State:
        return self._state


class OneAtATime(GuessDigit):
    SUPPORTS_CONCURRENT_SESSIONS = False


#: what the MCP environment's tools received, by every server in this process
TOOL_CALLS: list[tuple[str, str]] = []


class Lookup(MCPEnvironment):
    """Two MCP tools: ``lookup(key)`` answers from a table; ``submit(answer)`` ends the episode,
    1.0 when the answer is what ``lookup`` gave for the task's key in this session, else 0.0."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    TABLE: ClassVar[dict[str, str]] = {"a": "apple", "b": "banana"}

    def __init__(self) -> None:
        mcp = FastMCP("lookup")
        self.key, self.looked_up = "a", ""

        @mcp.tool()
        def lookup(key: str) -> str:
            """The value of a key."""
            TOOL_CALLS.append(("lookup", key))
            self.looked_up = self.TABLE.get(key, "unknown")
            return self.looked_up

        @mcp.tool()
        def submit(answer: str) -> str:
            """Submit the answer."""
            TOOL_CALLS.append(("submit", answer))
            return "submitted"

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        self.key, self.looked_up = kwargs.get("key", "a"), ""
        return Observation(
            metadata={"question": f"What is the value of {self.key!r}? Look it up, then submit it."}
        )

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        raise ValueError("this environment takes tool calls only")

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        obs = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and action.tool_name == "submit":
            right = self.looked_up == self.TABLE[self.key] == action.arguments.get("answer")
            obs.done, obs.reward = True, 1.0 if right else 0.0
        return obs

    @property
    def state(self) -> State:
        return self._state


def serve(app: Any) -> tuple[Any, threading.Thread, socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        thread.join(0.02)
    return server, thread, sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def guess_url() -> Iterator[str]:
    server, thread, sock, url = serve(
        create_app(GuessDigit, GuessAction, GuessObservation, max_concurrent_envs=8)
    )
    yield url
    server.should_exit = True
    thread.join(5)
    sock.close()


def bisect(messages: list[dict[str, Any]]) -> str:
    """A policy that finds the digit by halving the range the hints leave."""
    low, high, last = 0, 9, None
    for m in messages:
        if m["role"] == "assistant":
            last = int(m["content"])
        elif m["role"] == "user" and last is not None:
            low, high = (last + 1, high) if m["content"] == "higher" else (low, last - 1)
    return str((low + high) // 2)


def direct(seed: int) -> tuple[float, int]:
    """The rewards GuessDigit itself gives bisection for ``seed`` (summed) and the number of guesses."""
    env = GuessDigit()
    messages = [{"role": "user", "content": env.reset(seed=seed).prompt}]
    total, done, turns = 0.0, False, 0
    while not done:
        guess = bisect(messages)
        obs = env.step(GuessAction(guess=guess))
        total, done, turns = total + float(obs.reward or 0.0), obs.done, turns + 1
        messages += [{"role": "assistant", "content": guess}, {"role": "user", "content": obs.prompt}]
    return total, turns


def play(env: agl.envs.OpenEnv, replies: Any, task: dict[str, Any]) -> tuple[float, agl.MemoryStore, str]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = env.agent(task, server.llm(ro.id))
            ro.reward(reward)
    rollout = store.get_rollout(ro.id)
    assert rollout is not None and rollout.reward == reward
    return reward, store, ro.id


def llm_spans(store: agl.MemoryStore, rollout_id: str) -> list[agl.Span]:
    return [s for s in store.spans(rollout_id) if s.kind == "llm"]


def test_each_rollout_scores_what_the_environment_gave(guess_url: str) -> None:
    env = agl.envs.OpenEnv(guess_url, size=4, seed=5)
    assert env.tasks == [{"seed": 5}, {"seed": 6}, {"seed": 7}, {"seed": 8}]
    assert json.loads(json.dumps(env.tasks)) == env.tasks and not env.tools
    for task in env.tasks:
        reward, store, rid = play(env, bisect, task)
        expected, turns = direct(task["seed"])
        assert reward == pytest.approx(expected) and turns > 1  # several steps, each one's reward summed
        calls = llm_spans(store, rid)
        assert len(calls) == turns and str(task["seed"] % 10) in json.dumps(calls[-1].output)
        # one growing conversation: the last call saw every hint before it
        assert len(calls[-1].input) == 2 * turns
        assert [t.final_reward for t in agl.transitions(store)] == [pytest.approx(expected)] * turns
    assert env.rejected_actions == 0


def test_last_reward_and_an_episode_cut_at_max_turns(guess_url: str) -> None:
    last = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 7}], reward="last")
    reward, _, _ = play(last, bisect, last.tasks[0])
    assert reward == 1.0
    cut = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 7}], max_turns=2)
    reward, store, rid = play(cut, ["0"], cut.tasks[0])  # 0 twice: two wrong guesses, then cut
    assert reward == pytest.approx(-0.2) and len(llm_spans(store, rid)) == 2
    with pytest.raises(ValueError, match="'sum' or 'last'"):
        agl.envs.OpenEnv(guess_url, reward="mean")  # type: ignore[arg-type]


def test_a_class_served_here_and_stopped_at_close() -> None:
    with agl.envs.OpenEnv(GuessDigit, size=2, seed=3) as env:
        url = env.base_url
        assert url.startswith("http://127.0.0.1:")
        for task in env.tasks:
            reward, _, _ = play(env, bisect, task)
            assert reward == pytest.approx(direct(task["seed"])[0])
    with pytest.raises(ConnectionError, match="not answering"):
        agl.envs.OpenEnv(url)


def test_one_session_at_a_time_serialises_parallel_rollouts() -> None:
    env = agl.envs.OpenEnv(OneAtATime, size=4, seed=1)  # served with max_concurrent_envs=1
    try:
        store = agl.MemoryStore()
        tracer = agl.Tracer(store)
        rewards: dict[int, float] = {}
        with PolicyServer(engines.ScriptedEngine(bisect, tokenizer="bytes"), store) as server:

            def one(task: dict[str, Any]) -> None:
                with tracer.rollout(task) as ro:
                    rewards[task["seed"]] = env.agent(task, server.llm(ro.id))
                    ro.reward(rewards[task["seed"]])

            threads = [threading.Thread(target=one, args=(t,)) for t in env.tasks]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
        assert rewards == {s: pytest.approx(direct(s)[0]) for s in (1, 2, 3, 4)}
        assert {r.status for r in store.rollouts()} == {"succeeded"}
    finally:
        env.close()


def test_a_rejected_action_fails_the_rollout_with_the_environments_message(guess_url: str) -> None:
    env = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 4}])
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(["five"], tokenizer="bytes"), store) as server:
        with pytest.raises(
            RuntimeError, match=r"rejected the action \{'guess': 'five'\}.*not a digit: 'five'"
        ):
            with tracer.rollout(env.tasks[0]) as ro:
                env.agent(env.tasks[0], server.llm(ro.id))
    rollout = store.get_rollout(ro.id)
    assert rollout is not None and rollout.status == "failed" and "not a digit" in (rollout.error or "")
    [signal] = [s for s in store.spans(ro.id) if s.kind == "signal"]
    assert signal.name == "openenv.rejected" and signal.status == "error"
    # an action the schema refuses (a wrong field) is counted the same way
    wrong = agl.envs.OpenEnv(guess_url, tasks=[{"seed": 4}], action_from_reply=lambda reply: {"gues": reply})
    with pytest.raises(RuntimeError, match=r"rejected the action.*VALIDATION_ERROR"):
        play(wrong, ["5"], wrong.tasks[0])
    assert env.rejected_actions == 1 and wrong.rejected_actions == 1


def test_a_server_that_is_down_says_so() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    with pytest.raises(ConnectionError, match=f"OpenEnv server at http://127.0.0.1:{port} is not answering"):
        agl.envs.OpenEnv(f"http://127.0.0.1:{port}")
    env = agl.envs.OpenEnv(GuessDigit, size=1)
    env._served.stop()  # type: ignore[union-attr]  # the server goes away after the environment was made
    with pytest.raises(ConnectionError, match="is not answering"):
        play(env, ["5"], env.tasks[0])


def test_an_action_that_is_not_one_text_field_needs_action_from_reply() -> None:
    class Move(Action):
        x: int
        y: int

    class Grid(GuessDigit):
        pass

    server, thread, sock, url = serve(create_app(Grid, Move, GuessObservation))
    try:
        with pytest.raises(ValueError, match=r"fields \['x', 'y'\].*pass action_from_reply="):
            agl.envs.OpenEnv(url)
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


def lookup_policy(messages: list[dict[str, Any]]) -> Any:
    """Look the key up with the tool, then submit what the tool answered."""
    tool_results = [m["content"] for m in messages if m["role"] == "tool"]
    if not tool_results:
        key = re.search(r"value of '(\w+)'", messages[1]["content"]).group(1)  # type: ignore[union-attr]
        return {"tool_calls": [{"name": "lookup", "arguments": {"key": key}}]}
    return {"tool_calls": [{"name": "submit", "arguments": {"answer": tool_results[-1]}}]}


def test_mcp_tools_offered_called_and_their_results_reach_the_environment() -> None:
    TOOL_CALLS.clear()
    with agl.envs.OpenEnv(Lookup, tasks=[{"key": "a"}, {"key": "b"}]) as env:
        assert env.tools and env.action_from_reply is None  # CallToolAction: tools only
        for task, value in zip(env.tasks, ["apple", "banana"], strict=True):
            reward, store, rid = play(env, lookup_policy, task)
            assert reward == 1.0
            calls = llm_spans(store, rid)
            assert len(calls) == 2
            offered = [t["function"]["name"] for t in calls[0].attributes["tools"]]
            assert sorted(offered) == ["lookup", "submit"]
            # the tool's result went back to the model as a tool message, and from there to the env
            assert calls[1].input[-1] == {
                "role": "tool",
                "tool_call_id": calls[1].input[-2]["tool_calls"][0]["id"],
                "content": value,
            }
            tools = [(s.name, s.status, s.output) for s in store.spans(rid) if s.kind == "tool"]
            assert tools == [("lookup", "ok", value), ("submit", "ok", "submitted")]
        assert TOOL_CALLS == [("lookup", "a"), ("submit", "apple"), ("lookup", "b"), ("submit", "banana")]
        # a wrong answer scores 0.0; a failing tool call is an error the model sees, not a failed rollout
        wrong, _, _ = play(
            env, [{"tool_calls": [{"name": "submit", "arguments": {"answer": "pear"}}]}], env.tasks[0]
        )
        assert wrong == 0.0
        script = [{"tool_calls": [{"name": "lookup", "arguments": {"name": "a"}}]}, "I give up."]
        quit_, store, rid = play(env, script, env.tasks[0])
        [tool] = [s for s in store.spans(rid) if s.kind == "tool"]
        assert quit_ == 0.0 and tool.status == "error" and tool.output.startswith("error: ")
        assert "key" in tool.output and llm_spans(store, rid)[1].input[-1]["content"] == tool.output
        assert len(llm_spans(store, rid)) == 2  # a reply without a tool call ended the episode


def test_make_and_the_cli_build_it_from_a_url(guess_url: str, tmp_path: Path) -> None:
    env = agl.envs.make(f"openenv:{guess_url}", size=3, seed=2)
    ws = agl.envs.OpenEnv(guess_url.replace("http://", "ws://") + "/", size=1)
    assert ws.base_url == guess_url and ws.action_schema["title"] == "GuessAction"
    assert isinstance(env, agl.envs.OpenEnv) and env.tasks == [{"seed": 2}, {"seed": 3}, {"seed": 4}]
    options: dict[str, Any] = dict(agent=None, data=None, val_data=None, limit=None, env_size=3, seed=0)
    agent, tasks, val = env_tasks(argparse.Namespace(**options, env=f"openenv:{guess_url}", val_limit=2))
    assert isinstance(agent, agl.envs.EnvAgent) and isinstance(agent.env, agl.envs.OpenEnv)
    assert tasks == [{"seed": 0}, {"seed": 1}, {"seed": 2}] and val == [
        {"seed": 1_000_003},
        {"seed": 1_000_004},
    ]
    rows = tmp_path / "resets.jsonl"
    rows.write_text('{"seed": 11}\n{"seed": 12}\n')
    options["data"] = str(rows)
    agent, tasks, val = env_tasks(argparse.Namespace(**options, env=f"openenv:{guess_url}", val_limit=2))
    assert tasks == [{"seed": 11}, {"seed": 12}] and val is None
    reward, _, _ = play(agent.env, bisect, tasks[0])
    assert reward == pytest.approx(direct(11)[0])
