"""agl.envs.ReasoningGym: real reasoning-gym generators, scored by their own score_answer."""

from __future__ import annotations

import json

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
    config = {"min_terms": 2, "max_terms": 2, "operators": ["+"]}
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
