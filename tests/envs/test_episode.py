"""agl.envs.episode: the one episode loop, with hubs written in the tests as their hooks, played by a
scripted policy through the PolicyServer."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.envs.episode import (
    EpisodeResult,
    EpisodeSpec,
    Hooks,
    Observation,
    Reply,
    StepResult,
    ToolCall,
    ToolResult,
    Unreadable,
    UnreadableCount,
    run_episode,
)
from agentlightning_lite.serving import PolicyServer, engines

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test


def play(hooks: Hooks, spec: EpisodeSpec, replies: Any) -> tuple[float, agl.MemoryStore, str]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout({"q": 1}) as ro:
            reward = run_episode(hooks, spec, server.llm(ro.id), 0.0)
            ro.reward(reward)
    return reward, store, ro.id


def spans(store: agl.MemoryStore, rid: str, kind: str) -> list[agl.Span]:
    return [s for s in store.spans(rid) if s.kind == kind]


class Count(Hooks):
    """Say numbers: 0.25 a step, done at 3; the final reward a 1.0 bonus for finishing (the steps are
    intermediate rewards, so the final one leaves them out)."""

    def __init__(self) -> None:
        self.closed, self.episode = False, EpisodeResult()

    def reset(self) -> StepResult:
        return StepResult(Observation.text("Count to 3."))

    def act(self, reply: Reply) -> StepResult:
        done = reply.text.strip() == "3"
        return StepResult(None if done else Observation.text(f"{reply.text}, and then?"), 0.25, done)

    def reward(self, episode: EpisodeResult) -> float:
        self.episode = episode
        return 1.0 if episode.done else 0.0

    def close(self) -> None:
        self.closed = True


def test_step_rewards_are_intermediate_and_the_final_reward_is_the_hooks() -> None:
    hooks = Count()
    spec = EpisodeSpec("count", max_turns=5, max_tokens=8, system_prompt="Be brief.", step_rewards=True)
    reward, store, rid = play(hooks, spec, ["1", "2", "3"])
    assert reward == 1.0 and hooks.closed
    assert hooks.episode.rewards == [0.25] * 3 and hooks.episode.turns == 3 and not hooks.episode.cut
    calls = spans(store, rid, "llm")
    assert calls[-1].input == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count to 3."},
        {"role": "assistant", "content": "1"},
        {"role": "user", "content": "1, and then?"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2, and then?"},
    ]
    steps = [(s.name, s.output, bool(s.attributes.get("final"))) for s in spans(store, rid, "reward")]
    assert steps.count(("count.step", 0.25, False)) == 3
    # the default credit trains on the final reward; Discounted adds each step where it was earned
    assert [t.reward for t in agl.transitions(store)] == [1.0, 1.0, 1.0]
    ts = agl.transitions(store, credit=agl.credit.Discounted(1.0))
    assert [t.reward for t in ts] == [1.75, 1.5, 1.25]


def test_cut_at_max_turns_and_no_step_reward_spans_by_default() -> None:
    hooks = Count()
    reward, store, rid = play(hooks, EpisodeSpec("count", max_turns=2, max_tokens=8), ["1"])
    assert reward == 0.0 and hooks.episode.cut and hooks.episode.turns == 2
    assert hooks.episode.rewards == [0.25, 0.25] and spans(store, rid, "reward") == [
        s for s in spans(store, rid, "reward") if s.attributes.get("final")
    ]


class Shop(Hooks):
    """Tools only: ``price(item)`` answers, an unknown item is a tool error, ``buy(item)`` ends it."""

    def __init__(self) -> None:
        self.prices = {"apple": "3"}
        self.tools = [
            {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
            for n in ("price", "buy")
        ]
        self.answered_calls: list[tuple[str, str, str | None]] = []

    def reset(self) -> StepResult:
        return StepResult(Observation([{"role": "user", "content": "Buy an apple."}], tools=self.tools))

    def act(self, reply: Reply) -> StepResult:
        return StepResult(done=True)

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        item = arguments.get("item")
        if name == "buy":
            return ToolResult("bought", reward=1.0, done=True)
        if item not in self.prices:
            return ToolResult(f"error: no {item}", error=f"no {item}", reward=-0.1)
        return ToolResult(self.prices[item])

    def answered(self, call: ToolCall, result: ToolResult) -> None:
        self.answered_calls.append((call.name, result.text, result.error))


def test_tool_calls_are_tool_spans_and_their_results_go_back() -> None:
    script = [
        {"tool_calls": [{"name": "price", "arguments": {"item": "pear"}}]},
        {"tool_calls": [{"name": "price", "arguments": {"item": "apple"}}, {"name": "buy", "arguments": {}}]},
        "never asked",
    ]
    hooks = Shop()
    reward, store, rid = play(hooks, EpisodeSpec("shop", max_turns=8, max_tokens=512), script)
    assert reward == pytest.approx(0.9)  # the default final reward: the sum of what the steps gave
    tools = [(s.name, s.status, s.output) for s in spans(store, rid, "tool")]
    assert tools == [("price", "error", "error: no pear"), ("price", "ok", "3"), ("buy", "ok", "bought")]
    assert [(n, e) for n, _, e in hooks.answered_calls] == [
        ("price", "no pear"),
        ("price", None),
        ("buy", None),
    ]
    calls = spans(store, rid, "llm")
    assert len(calls) == 2 and [t["function"]["name"] for t in calls[0].attributes["tools"]] == [
        "price",
        "buy",
    ]
    assert calls[1].input[-1]["role"] == "tool" and calls[1].input[-1]["content"] == "error: no pear"


class Strict(Hooks):
    def reset(self) -> StepResult:
        return StepResult(Observation.text("A digit?", fresh=True))

    def act(self, reply: Reply) -> StepResult:
        if not reply.text.isdigit():
            raise Unreadable(f"not a digit: {reply.text!r}")
        return StepResult(Observation.text(f"{reply.text} noted. Another?", fresh=True), reward=0.5)


def test_unreadable_replies_end_the_episode_counted_and_fresh_observations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    count = UnreadableCount()
    spec = EpisodeSpec("digits", max_turns=5, max_tokens=8, unreadable_reward=-1.0, unreadable=count)
    with caplog.at_level(logging.WARNING):
        reward, store, rid = play(Strict(), spec, ["4", "four"])
    assert reward == -1.0 and count.value == 1 and "unreadable_reward=-1.0" in caplog.text
    [signal] = spans(store, rid, "signal")
    assert (signal.name, signal.status, signal.output) == (
        "digits.unreadable",
        "error",
        "not a digit: 'four'",
    )
    calls = spans(store, rid, "llm")
    assert [m["content"] for m in calls[1].input] == ["4 noted. Another?"]  # fresh: only the last observation
    with pytest.raises(Unreadable, match="not a digit: 'five'"):
        play(Strict(), EpisodeSpec("digits", max_turns=5, max_tokens=8), ["five"])


class Canned:
    """An ``llm`` whose client answers real ``ChatCompletion`` objects from a list: a reply a model
    server could send but the PolicyServer's parsers would not pass on (arguments that are not JSON)."""

    model = "canned"

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = iter(messages)
        completions = type("Completions", (), {"create": lambda _, **kw: self.create(**kw)})()
        self.client = type("Client", (), {"chat": type("Chat", (), {"completions": completions})()})()

    def prompt(self, name: str, default: str) -> str:
        return default

    def openai_client(self, **options: Any) -> Any:
        return self.client

    def create(self, **request: Any) -> Any:
        from openai.types.chat import ChatCompletion

        choice = {
            "index": 0,
            "finish_reason": "stop",
            "message": {"role": "assistant", **next(self.messages)},
        }
        return ChatCompletion.model_validate(
            {"id": "c", "object": "chat.completion", "created": 0, "model": self.model, "choices": [choice]}
        )


def test_tool_arguments_that_are_not_json_are_a_failed_tool_span_the_model_sees() -> None:
    call = {"id": "t1", "type": "function", "function": {"name": "price", "arguments": "{not json"}}
    hooks = Shop()
    tracer = agl.Tracer(agl.MemoryStore())
    with tracer.rollout({"q": 1}) as ro:
        reward = run_episode(
            hooks,
            EpisodeSpec("shop", 3, 8),
            Canned([{"content": None, "tool_calls": [call]}, {"content": "ok"}]),
            0.0,
        )
    assert reward == 0.0 and hooks.answered_calls[0][0] == "price"
    [tool] = [s for s in tracer.store.spans(ro.id) if s.kind == "tool"]
    assert tool.status == "error" and tool.output.startswith("error: the arguments are not JSON")
    assert hooks.answered_calls[0][1] == tool.output
