"""agl.envs.ReasoningGym: real reasoning-gym generators, scored by their own score_answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test

reasoning_gym = pytest.importorskip("reasoning_gym")


@pytest.mark.parametrize("name", ["basic_arithmetic", "leg_counting", "letter_counting"])
def test_tasks_are_the_generators_entries_and_json(name: str) -> None:
    env = agl.envs.ReasoningGym(name, size=5, seed=3)
    dataset = reasoning_gym.create_dataset(name, size=5, seed=3)
    assert [t["question"] for t in env.tasks] == [dataset[i]["question"] for i in range(5)]
    assert [t["answer"] for t in env.tasks] == [dataset[i]["answer"] for i in range(5)]
    assert json.loads(json.dumps(env.tasks)) == env.tasks  # the store can record them
    task = json.loads(json.dumps(env.tasks[2]))
    assert agl.envs.ReasoningGym.entry(task) == dataset[2]
    assert env.reward(task, f"thinking...\n<answer>{task['answer']}</answer>") == 1.0
    assert env.reward(task, "<answer>certainly wrong</answer>") == 0.0


def test_config_reaches_the_generator() -> None:
    env = agl.envs.ReasoningGym("basic_arithmetic", size=3, seed=0, min_terms=2, max_terms=2, operators=["+"])
    assert all(t["question"].count("+") == 1 for t in env.tasks)
    assert env.tasks[0]["config"] == {"min_terms": 2, "max_terms": 2, "operators": ["+"]}


def test_an_invalid_config_is_a_value_error_naming_it() -> None:
    with pytest.raises(
        ValueError, match=r"reasoning-gym 'leg_counting': config .*max_animals must be >= min_animals"
    ):
        agl.envs.ReasoningGym("leg_counting", size=2, seed=0, min_animals=3, max_animals=2)


def test_answer_is_the_last_answer_tag_else_the_last_line() -> None:
    from agentlightning_lite.envs.reasoning_gym import extract_answer

    assert extract_answer("<answer>1</answer> then <answer> 2 </answer>") == "2"
    assert extract_answer("work\n\n 7 \n") == "7"
    assert extract_answer(None) == ""


@pytest.mark.parametrize("correct", [True, False])
def test_default_agent_against_a_policy_server(correct: bool) -> None:
    env = agl.envs.ReasoningGym("basic_arithmetic", size=2, seed=1)
    task = env.tasks[0]
    reply = f"5 - 3 - 6 = -4\n<answer>{task['answer'] if correct else '4'}</answer>"
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine([reply], tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = env.agent(task, server.llm(ro.id))
            ro.reward(reward)
    assert reward == (1.0 if correct else 0.0)
    rollout = store.get_rollout(ro.id)
    assert rollout is not None and rollout.reward == reward and rollout.task == task
    llm_spans = [s for s in store.spans(ro.id) if s.kind == "llm"]
    assert len(llm_spans) == 1 and "<answer>" in json.dumps(llm_spans[0].input)
    [transition] = agl.transitions(store)
    assert transition.final_reward == reward and transition.response_token_ids


def test_shots_are_solved_turns_of_the_same_generator_sent_to_the_server() -> None:
    config: dict[str, Any] = {"min_terms": 2, "max_terms": 2, "operators": ["+"]}
    train = agl.envs.ReasoningGym("basic_arithmetic", size=3, seed=1, shots=2, system_prompt="Sum.", **config)
    held_out = agl.envs.ReasoningGym("basic_arithmetic", size=3, seed=9, shots=2, **config)
    demos = reasoning_gym.create_dataset("basic_arithmetic", size=2, seed=777, **config)
    expected = [(demos[i]["question"], demos[i]["answer"]) for i in range(2)]
    assert train.shots == held_out.shots == expected  # one fixed set: training and held-out prompts match
    assert all(q.count("+") == 1 for q, _ in train.shots)
    task = train.tasks[0]
    sent = train.messages(task)
    assert sent[0] == {"role": "system", "content": "Sum."}
    assert sent[1:5] == [
        {"role": "user", "content": expected[0][0]},
        {"role": "assistant", "content": f"<answer>{expected[0][1]}</answer>"},
        {"role": "user", "content": expected[1][0]},
        {"role": "assistant", "content": f"<answer>{expected[1][1]}</answer>"},
    ]
    assert sent[-1] == {"role": "user", "content": task["question"]}
    assert agl.envs.ReasoningGym("basic_arithmetic", size=1, seed=1, **config).shots == []

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    engine = engines.ScriptedEngine([f"<answer>{task['answer']}</answer>"], tokenizer="bytes")
    with PolicyServer(engine, store) as srv:
        with tracer.rollout(task) as ro:
            ro.reward(train.agent(task, srv.llm(ro.id)))
    [span] = [s for s in store.spans(ro.id) if s.kind == "llm"]
    recorded = json.dumps(span.input)
    assert expected[0][0] in recorded and f"<answer>{expected[1][1]}</answer>" in recorded
    assert store.get_rollout(ro.id).reward == 1.0  # type: ignore[union-attr]


def test_negative_shots_are_refused() -> None:
    with pytest.raises(ValueError, match="shots must be >= 0"):
        agl.envs.ReasoningGym("basic_arithmetic", size=1, seed=0, shots=-1)


def test_the_agent_stops_at_the_closing_tag_and_scores_the_reply_cut_before_it() -> None:
    env = agl.envs.ReasoningGym("basic_arithmetic", size=2, seed=1)
    task = env.tasks[0]
    assert env.stop == ["</answer>"] and env.max_tokens == 512 and env.agent.max_rollout_tokens == 512
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    # the engine stops at the stop string and leaves it out of the reply, as OpenAI does
    engine = engines.ScriptedEngine(
        [f"5 - 3 - 6 = -4\n<answer>{task['answer']}</answer>\nmore"], tokenizer="bytes"
    )
    with PolicyServer(engine, store) as server:
        with tracer.rollout(task) as ro:
            reward = env.agent(task, server.llm(ro.id))
    [span] = [s for s in store.spans(ro.id) if s.kind == "llm"]
    assert (
        span.attributes["params"]["stop"] == ["</answer>"] and span.attributes["params"]["max_tokens"] == 512
    )
    assert span.output["content"] == f"5 - 3 - 6 = -4\n<answer>{task['answer']}"
    assert span.attributes["stop_reason"] == "</answer>" and reward == 1.0
    assert env.reward(task, "<answer>4") == 0.0
    no_stop = agl.envs.ReasoningGym("basic_arithmetic", size=2, seed=1, stop=(), max_tokens=64)
    assert no_stop.stop == [] and no_stop.agent.max_rollout_tokens == 64


def test_an_answer_cut_at_the_stop_string_is_read() -> None:
    from agentlightning_lite.envs.reasoning_gym import extract_answer

    assert extract_answer("think\n<answer> -4 ") == "-4"
    assert extract_answer("<answer>1</answer> then <answer> 2") == "2"  # the last one, left open
    assert extract_answer("<answer>1</answer> then <answer>") == "1"  # an empty open tag: the closed one
    assert extract_answer("no tags\n<answer>") == "<answer>"  # nothing after it: the last line


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_reply_cut_at_the_stop_string_keeps_the_tokens_it_sampled(tiny_engine: Any) -> None:
    """The HF engine leaves the stop string out of the reply's text but keeps the tokens it sampled
    and their logprobs: training on a reply that stopped at ``</answer>`` trains what was generated."""
    engine = tiny_engine(no_eos=True)
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)

    def greedy(env: agl.envs.ReasoningGym) -> Any:
        """The llm span of one greedy rollout (``validation_rollout``: temperature 0)."""
        with tracer.rollout(env.tasks[0]) as ro:
            env.agent.validation_rollout(env.tasks[0], server.llm(ro.id))
        [span] = [s for s in store.spans(ro.id) if s.kind == "llm"]
        return span

    with PolicyServer(engine, store) as server:
        whole = greedy(agl.envs.ReasoningGym("basic_arithmetic", size=1, seed=1, stop=(), max_tokens=24))
        text = engine.decode(whole.response_token_ids)
        stop = next(text[i : i + 2] for i in range(len(text) - 1) if "\ufffd" not in text[i : i + 2])
        cut = greedy(agl.envs.ReasoningGym("basic_arithmetic", size=1, seed=1, stop=[stop], max_tokens=24))
    ids = cut.response_token_ids
    assert engine.decode(ids) == text[: text.index(stop) + len(stop)]  # the stop string's tokens kept
    assert ids == whole.response_token_ids[: len(ids)] and len(cut.response_logprobs) == len(ids)
    assert cut.response_logprobs == pytest.approx(whole.response_logprobs[: len(ids)], abs=1e-4)
    assert cut.output["content"] == text[: text.index(stop)]  # the reply: without it
    assert cut.attributes["stop_reason"] == stop and whole.attributes["finish_reason"] == "length"
