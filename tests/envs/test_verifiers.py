"""agl.envs.Verifiers: a real verifiers v1 taskset played through the PolicyServer, scored by its rewards.

Needs the ``envs-verifiers`` extra, which the dev install leaves out (verifiers 0.4 pins mcp==2.0.0, the
adapters extra's crewai needs mcp<2): ``nox -s envs-verifiers`` runs this file in its own environment.
"""

from __future__ import annotations

import argparse
import json
import runpy
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

pytest.importorskip("openai")  # the agents' client: imported here, not inside the first test
vf = pytest.importorskip(
    "verifiers.v1", reason='verifiers is not installed: pip install "agentlightning-lite[envs-verifiers]"'
)

# a taskset as a verifiers user writes one: typed task data, @vf.reward / @vf.metric on the task
TASKSET = """
import verifiers.v1 as vf

QUESTIONS = [("What is 2+2?", "4"), ("What is 3+4?", "7"), ("What is 5+5?", "10"), ("What is 1+8?", "9")]


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.5)
    async def mentions(self, task, trace) -> float:
        return float(task.answer in trace.last_reply.split())

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        for question, answer in QUESTIONS:
            data = SumData(prompt=question, answer=answer, system_prompt="Answer with the number only.")
            yield SumTask(data, self.config.task)


def load_taskset():
    return SumTaskset(vf.TasksetConfig())
"""


def expected(answer: str, reply: str) -> float:
    """The taskset's reward written out: exact match (weight 1) plus the answer among the words (0.5)."""
    return float(reply.strip() == answer) + 0.5 * float(answer in reply.strip().split())


@pytest.fixture
def spec(tmp_path: Path) -> str:
    path = tmp_path / "sum_tasks.py"
    path.write_text(TASKSET)
    return f"{path}:load_taskset"


def test_tasks_are_the_tasksets_and_json(spec: str) -> None:
    env = agl.envs.Verifiers(spec)
    own = list(runpy.run_path(spec.rpartition(":")[0])["load_taskset"]())  # the taskset, loaded here
    assert [t["data"]["prompt"] for t in env.tasks] == [t.data.prompt for t in own]
    assert [t["data"]["answer"] for t in env.tasks] == ["4", "7", "10", "9"]
    assert [t["key"] for t in env.tasks] == [t.key for t in own]
    copy = json.loads(json.dumps(env.tasks[1]))  # the store's copy
    assert env.vf_task(copy).data.model_dump() == own[1].data.model_dump()
    assert env.messages(copy) == [
        {"role": "system", "content": "Answer with the number only."},
        {"role": "user", "content": "What is 3+4?"},
    ]
    assert len(agl.envs.Verifiers(spec, size=2, seed=1).tasks) == 2
    shuffled = [t["idx"] for t in agl.envs.Verifiers(spec, seed=3).tasks]
    assert sorted(shuffled) == [0, 1, 2, 3] and shuffled != [0, 1, 2, 3]
    with pytest.raises(KeyError, match="not a task of"):
        env.vf_task({"key": "nope"})


@pytest.mark.parametrize("reply", ["7", "It is 7", "7 or 8", "8", "", "77"])
def test_reward_is_the_tasks_own(spec: str, reply: str) -> None:
    env = agl.envs.Verifiers(spec)
    task = env.tasks[1]
    trace = env.score(task, reply)
    assert set(trace.rewards) == {"exact", "mentions"} and trace.metrics == {"reply_chars": len(reply)}
    assert trace.rewards["mentions"].weight == 0.5
    assert env.reward(task, reply) == trace.reward == expected("7", reply)


def test_rollouts_through_the_policy_server(spec: str) -> None:
    env = agl.envs.Verifiers(spec)
    answers = {"What is 2+2?": "4", "What is 3+4?": "It is 7", "What is 5+5?": "11", "What is 1+8?": "9"}

    def policy(messages: list[dict[str, Any]]) -> str:
        return answers[messages[-1]["content"]]

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    rewards = {}
    with PolicyServer(engines.ScriptedEngine(policy, tokenizer="bytes"), store) as server:
        for task in env.tasks:
            with tracer.rollout(task) as ro:
                reward = env.agent(task, server.llm(ro.id))
                ro.reward(reward)
            rewards[ro.id] = reward
    want = {"4": 1.5, "7": 0.5, "10": 0.0, "9": 1.5}
    for rid, reward in rewards.items():
        rollout = store.get_rollout(rid)
        assert rollout is not None and rollout.reward == reward
        [call] = [s for s in store.spans(rid) if s.kind == "llm"]
        reply = call.output["content"]
        answer = rollout.task["data"]["answer"]
        assert reward == expected(answer, reply) == want[answer]  # verifiers' reward for that reply
        assert call.input[0]["content"] == "Answer with the number only."
        [signal] = [s for s in store.spans(rid) if s.kind == "signal" and s.name == "verifiers"]
        named = {"exact": [float(reply == answer), 1.0], "mentions": [float(answer in reply.split()), 0.5]}
        assert signal.output["rewards"] == named
        assert signal.output["metrics"] == {"reply_chars": len(reply)}
    ts = agl.transitions(store)
    assert len(ts) == 4 and all(t.response_token_ids for t in ts)
    assert sorted(t.final_reward for t in ts) == [0.0, 0.5, 1.5, 1.5]


def test_the_trace_carries_the_calls_usage(spec: str) -> None:
    env = agl.envs.Verifiers(spec)
    task = env.tasks[0]
    store = agl.MemoryStore()
    with PolicyServer(engines.ScriptedEngine(["4"], tokenizer="bytes"), store) as server:
        ro = store.start_rollout(task)
        llm = server.llm(ro.rollout_id)
        completion = llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, messages=env.messages(task), max_tokens=8
        )
    trace = env.score(task, completion)
    [call] = trace.calls
    assert call.usage is not None and call.usage.prompt_tokens == completion.usage.prompt_tokens > 0
    assert call.usage.completion_tokens == completion.usage.completion_tokens > 0
    assert call.finish_reason == "stop" and trace.last_reply == "4" and trace.reward == 1.5
    assert [m.role for m in trace.messages] == ["system", "user", "assistant"]


def test_make_and_the_cli_spec(spec: str) -> None:
    from agentlightning_lite.cli.train import env_tasks

    env = agl.envs.make(f"verifiers:{spec}", size=3, seed=0)
    assert isinstance(env, agl.envs.Verifiers) and len(env.tasks) == 3
    options: dict[str, Any] = dict(agent=None, data=None, val_data=None, limit=None, seed=0)
    args = argparse.Namespace(env=f"verifiers:{spec}", env_size=3, val_limit=1, **options)
    agent, tasks, val = env_tasks(args)
    assert isinstance(agent, agl.envs.EnvAgent) and len(tasks) == 3 and val is not None and len(val) == 1
    assert {t["key"] for t in val}.isdisjoint(t["key"] for t in tasks)  # held out: the task after them
    assert agent.env.vf_task(val[0]).data.prompt == val[0]["data"]["prompt"]


def test_a_taskset_by_its_verifiers_id(tmp_path: Path, monkeypatch: Any) -> None:
    package = tmp_path / "agl_sum_tasks"  # an installed taskset package, as verifiers' loaders find them
    package.mkdir()
    (package / "__init__.py").write_text(TASKSET + '\n__all__ = ["SumTaskset"]\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    env = agl.envs.Verifiers("agl-sum-tasks")  # verifiers normalises the id to the module's name
    assert [t["data"]["answer"] for t in env.tasks] == ["4", "7", "10", "9"]
    assert env.reward(env.tasks[0], "4") == 1.5
    shuffled = agl.envs.make("verifiers:agl-sum-tasks", size=2, seed=0)  # what --env gives: shuffled by seed
    assert [t["key"] for t in shuffled.tasks] == [
        t["key"] for t in agl.envs.Verifiers(env.taskset, 2, seed=0).tasks
    ]
    with pytest.raises(ImportError, match="taskset 'no-such-taskset' not found"):
        agl.envs.Verifiers("no-such-taskset")


UNSUPPORTED = """
import verifiers.v1 as vf


class BoxTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    NEEDS_CONTAINER = True

    @vf.reward
    async def ok(self, trace) -> float:
        return 1.0


class RuntimeTask(vf.Task[vf.TaskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def file_written(self, trace, runtime) -> float:
        return 1.0


class Boxes(vf.Taskset[BoxTask, vf.TasksetConfig]):
    def load(self):
        yield BoxTask(vf.TaskData(prompt="hi"), self.config.task)


class Runtimes(vf.Taskset[RuntimeTask, vf.TasksetConfig]):
    def load(self):
        yield RuntimeTask(vf.TaskData(prompt="hi"), self.config.task)


class Judged(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        config = vf.TaskConfig(judges=[{"id": "reference"}])  # on Prime's hosted endpoint
        yield vf.Task(vf.TaskData(prompt="hi"), config)


class JudgedHere(vf.Taskset[vf.Task, vf.TasksetConfig]):
    def load(self):
        judge = {"id": "reference", "base_url": "http://127.0.0.1:9/v1", "api_key_var": "MY_JUDGE_KEY"}
        yield vf.Task(vf.TaskData(prompt="hi"), vf.TaskConfig(judges=[judge]))
"""


def test_what_needs_verifiers_runtime_or_a_login_is_refused(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "unsupported.py"
    path.write_text(UNSUPPORTED)
    with pytest.raises(ValueError, match=r"needs a container runtime.*Prime login"):
        agl.envs.Verifiers(f"{path}:Boxes")
    with pytest.raises(ValueError, match=r"\['file_written'\] read the runtime"):
        agl.envs.Verifiers(f"{path}:Runtimes")
    monkeypatch.delenv("PRIME_API_KEY", raising=False)
    with pytest.raises(ValueError, match=r"plugged judge 'reference'.*PRIME_API_KEY is not set"):
        agl.envs.Verifiers(f"{path}:Judged")
    assert len(agl.envs.Verifiers(f"{path}:JudgedHere").tasks) == 1  # a judge at your own endpoint is fine
    with pytest.raises(ValueError, match="has no attribute 'Nope'"):
        agl.envs.Verifiers(f"{path}:Nope")
    with pytest.raises(TypeError, match="expected a verifiers Taskset"):
        agl.envs.Verifiers(lambda: 42)


MULTI_TURN = """
import verifiers.v1 as vf


class TwoSidedConfig(vf.EnvConfig):
    student: vf.AgentConfig = vf.AgentConfig()
    teacher: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"}, max_turns=4)


class TwoSided(vf.Env[TwoSidedConfig]):
    async def run(self, task, agents):
        async with agents.teacher.interaction(task), agents.student.interaction(task):
            pass
"""


def test_a_verifiers_environment_class_is_refused_saying_what_is_played(tmp_path: Path) -> None:
    from verifiers.v1.envs.user_sim.env import UserSimEnv  # verifiers' own multi-turn environment

    from agentlightning_lite.cli import CLIError
    from agentlightning_lite.cli.train import env_tasks

    path = tmp_path / "two_sided.py"
    path.write_text(MULTI_TURN)
    said = (
        r"TwoSided is a verifiers environment \(vf\.Env: .*multi-turn.*\), not a taskset.*give it the taskset"
    )
    with pytest.raises(TypeError, match=said):  # not "Env.__init__() missing ... 'config'"
        agl.envs.Verifiers(f"{path}:TwoSided")
    with pytest.raises(TypeError, match=r"UserSimEnv is a verifiers environment.*vf-eval"):
        agl.envs.Verifiers(UserSimEnv)
    with pytest.raises(TypeError, match=r"UserSimEnv is a verifiers environment"):
        agl.envs.Verifiers(lambda: UserSimEnv.__new__(UserSimEnv))  # a loader that returns one
    options: dict[str, Any] = dict(agent=None, data=None, val_data=None, limit=None, seed=0)
    args = argparse.Namespace(env=f"verifiers:{path}:TwoSided", env_size=3, val_limit=0, **options)
    with pytest.raises(CLIError, match="TwoSided is a verifiers environment") as err:
        env_tasks(args)
    assert err.value.code == 2


# a multi-turn environment as a verifiers user writes one (0.4: vf.Env.run over the seat's interaction)
HINTS = """
import verifiers.v1 as vf


class GuessData(vf.TaskData):
    answer: str


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def solved(self, trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.metric
    async def guesses(self, trace) -> float:
        return float(trace.num_turns)


class Guesses(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for answer in ("3", "8"):
            data = GuessData(prompt="Guess a digit.", answer=answer, system_prompt="Reply with one digit.")
            yield GuessTask(data, self.config.task)


class HintsConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()
    max_hints: int = 5


class Hints(vf.Env[HintsConfig]):
    \"\"\"Answer each wrong guess with 'higher' or 'lower' until it is right or the hints run out.\"\"\"

    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            segment = await chat.turn()
            for _ in range(self.config.max_hints):
                guess = segment.last_reply
                if segment.terminated or guess == task.data.answer:
                    break
                segment = await chat.turn("higher" if guess < task.data.answer else "lower")


class Broken(Hints):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            await chat.turn()
            raise KeyError("no board")


class Judging(Hints):
    async def finalize(self, task, episode):
        pass


class Stopping(GuessTask):
    @vf.stop
    async def enough(self, trace) -> bool:
        return trace.num_turns > 2


class Stops(vf.Taskset[Stopping, vf.TasksetConfig]):
    def load(self):
        yield Stopping(GuessData(prompt="Guess a digit.", answer="3"), self.config.task)
"""


def digits(messages: list[dict[str, Any]]) -> str:
    """Bisect the digits on the hints so far."""
    low, high, last = 0, 9, None
    for m in messages:
        if m["role"] == "assistant":
            last = int(m["content"])
        elif m["role"] == "user" and last is not None:
            low, high = (last + 1, high) if m["content"] == "higher" else (low, last - 1)
    return str((low + high) // 2)


@pytest.fixture
def hints(tmp_path: Path) -> str:
    path = tmp_path / "hints.py"
    path.write_text(HINTS)
    return str(path)


def played(env: agl.envs.Verifiers, replies: Any, task: dict[str, Any]) -> tuple[float, agl.MemoryStore, str]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = env.agent(task, server.llm(ro.id))
            ro.reward(reward)
    return reward, store, ro.id


def test_a_multi_turn_environment_plays_turn_by_turn(hints: str) -> None:
    env = agl.envs.Verifiers(f"{hints}:Guesses", env=f"{hints}:Hints")
    assert env.seat == "player" and [t["data"]["answer"] for t in env.tasks] == ["3", "8"]
    for task, guesses in zip(env.tasks, [["4", "1", "2", "3"], ["4", "7", "8"]], strict=True):
        reward, store, rid = played(env, digits, task)
        assert reward == 1.0
        calls = [s for s in store.spans(rid) if s.kind == "llm"]
        assert [c.output["content"] for c in calls] == guesses  # one model call per turn of the env
        # one growing conversation: the task's messages, then each guess and the env's hint
        assert calls[-1].input[:2] == [
            {"role": "system", "content": "Reply with one digit."},
            {"role": "user", "content": "Guess a digit."},
        ]
        assert len(calls[-1].input) == 2 * len(guesses)
        hinted = ["higher" if g < task["data"]["answer"] else "lower" for g in guesses[:-1]]
        assert [m["content"] for m in calls[-1].input[3::2]] == hinted
        [signal] = [s for s in store.spans(rid) if s.kind == "signal" and s.name == "verifiers"]
        assert signal.output == {"rewards": {"solved": [1.0, 1.0]}, "metrics": {"guesses": len(guesses)}}
        assert [t.final_reward for t in agl.transitions(store)] == [1.0] * len(guesses)


def test_turns_cut_and_the_environments_config(hints: str) -> None:
    cut = agl.envs.Verifiers(f"{hints}:Guesses", env=f"{hints}:Hints", max_turns=2)
    reward, store, rid = played(cut, ["0"], cut.tasks[0])  # 0 again and again: cut after two turns
    assert reward == 0.0 and len([s for s in store.spans(rid) if s.kind == "llm"]) == 2
    one = agl.envs.Verifiers(f"{hints}:Guesses", env=f"{hints}:Hints", env_config={"max_hints": 1})
    reward, store, rid = played(one, ["0", "1", "3"], one.tasks[0])  # the env ends after one hint
    assert reward == 0.0 and len([s for s in store.spans(rid) if s.kind == "llm"]) == 2
    [signal] = [s for s in store.spans(rid) if s.kind == "signal" and s.name == "verifiers"]
    assert signal.output["metrics"] == {"guesses": 2}


def test_a_one_seat_environment_of_verifiers_own(spec: str) -> None:
    from verifiers.v1.envs.single_agent.env import SingleAgentEnv  # agents.agent.run(task): one turn

    env = agl.envs.Verifiers(spec, env=SingleAgentEnv)
    reward, store, rid = played(env, ["It is 7"], env.tasks[1])
    assert reward == expected("7", "It is 7") == 0.5
    assert len([s for s in store.spans(rid) if s.kind == "llm"]) == 1


def test_what_does_not_fit_the_loop_is_refused_saying_why(hints: str, tmp_path: Path) -> None:
    from verifiers.v1.envs.user_sim.env import UserSimEnv

    with pytest.raises(TypeError, match=r"UserSimEnv has 2 agent seats \(assistant, user\).*vf-eval"):
        agl.envs.Verifiers(f"{hints}:Guesses", env=UserSimEnv)
    with pytest.raises(TypeError, match=r"Judging overrides finalize"):
        agl.envs.Verifiers(f"{hints}:Guesses", env=f"{hints}:Judging")
    with pytest.raises(ValueError, match=r"@vf.stop hooks \['enough'\]"):
        agl.envs.Verifiers(f"{hints}:Stops", env=f"{hints}:Hints")
    with pytest.raises(TypeError, match="env= takes a verifiers environment"):
        agl.envs.Verifiers(f"{hints}:Guesses", env=object())
    broken = agl.envs.Verifiers(f"{hints}:Guesses", env=f"{hints}:Broken")
    with pytest.raises(RuntimeError, match=r"Broken.run failed: KeyError: 'no board'"):
        played(broken, ["1"], broken.tasks[0])


@pytest.mark.slow  # a GRPO step of a tiny model (a few seconds)
def test_one_training_step_rewards_are_the_tasksets(spec: str, tiny_engine: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from agentlightning_lite.rl.config import LoggingConfig

    env = agl.envs.Verifiers(spec, size=2, max_tokens=4)
    trainer = agl.Trainer(
        engine=tiny_engine(lora=agl.LoRA(r=2, alpha=4)),
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
    )
    try:
        out = trainer.fit(env.agent, env.tasks, steps=1)
        rollouts = trainer.store.rollouts(mode="train")
        assert len(rollouts) == 4 and out["train/failed_rollouts"] == 0
        for r in rollouts:
            [call] = [s for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"]
            assert r.reward == env.reward(r.task, call.output["content"])
        assert out["train/samples"] == 4
    finally:
        trainer.close()
