"""``SFT(teacher=...)`` with remote runners: the teacher plays the policy for the step's rollouts, which
the runners' agents run against the trainer's server; every other rollout is served by the policy."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import RolloutConfig, SampleConfig
from agentlightning_lite.rl.session import Rollouts
from agentlightning_lite.serving.engines import ScriptedEngine

REPLIES: dict[str, str] = {}  # rollout id -> the reply its agent got
SLOW = threading.Event()  # set: the agent waits for GO before its call (a teacher step held open)
GO = threading.Event()


def agent(task: str, llm: agl.LLM) -> float:
    if SLOW.is_set():
        GO.wait(30)
    reply = llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task}]
    )
    REPLIES[str(llm.rollout_id)] = reply.choices[0].message.content or ""
    return 1.0


@pytest.fixture
def session() -> Iterator[Rollouts]:
    store = agl.MemoryStore()
    policy = ScriptedEngine(["policy says"], tokenizer="bytes")
    rollouts = Rollouts(
        policy,
        store,
        agl.Tracer(store),
        RolloutConfig(timeout=60),
        SampleConfig(),
        source=agl.RemoteRunners(port=0),
    )
    REPLIES.clear()
    SLOW.clear()
    GO.clear()
    with rollouts.serving():
        with agl.remote.Runner(agent, rollouts.source.url, workers=4, claim_wait=0.5):  # type: ignore[attr-defined]
            yield rollouts
    rollouts.stop()


def replies(results: list[Any]) -> list[str]:
    assert all(r.status == "succeeded" for r in results), [(r.status, r.error) for r in results]
    return [REPLIES[r.rollout_id] for r in results]


def test_the_teacher_answers_the_runners_sft_rollouts_and_the_policy_everything_else(
    session: Rollouts,
) -> None:
    teacher = ScriptedEngine(["teacher says"], tokenizer="bytes")
    tasks = [(i, f"task {i}") for i in range(3)]
    sft = agl.SFT(teacher=teacher, group_size=2)
    assert replies(session.step_results(agent, tasks, 0, sft)) == ["teacher says"] * 6
    assert session.server.engine is session.engine  # the policy is served again
    assert replies(session.evaluate(agent, ["a", "b"])) == ["policy says"] * 2
    grpo = agl.GRPO(group_size=2)
    assert replies(session.step_results(agent, tasks[:1], 1, grpo)) == ["policy says"] * 2
    samples, _ = session.samples(session.step_results(agent, tasks[:1], 2, sft))
    assert [teacher.decode(s.response_ids) for s in samples] == ["teacher says"] * 2  # the tokens trained


def test_rollouts_of_the_policy_wait_while_the_teacher_is_served(session: Rollouts) -> None:
    """An evaluation started while a teacher step runs (asynchronous training) is served by the policy."""
    teacher = ScriptedEngine(["teacher says"], tokenizer="bytes")
    SLOW.set()
    out: dict[str, list[str]] = {}
    step = threading.Thread(
        target=lambda: out.update(
            train=replies(session.step_results(agent, [(0, "t")], 0, agl.SFT(teacher=teacher)))
        )
    )
    step.start()
    while session.server.engine is not teacher:  # the teacher step holds the server
        threading.Event().wait(0.01)
    val = threading.Thread(target=lambda: out.update(val=replies(session.evaluate(agent, ["v"]))))
    val.start()
    val.join(0.5)
    assert val.is_alive()  # it waits for the teacher step
    GO.set()
    step.join(30)
    val.join(30)
    assert out == {"train": ["teacher says"], "val": ["policy says"]}


def test_a_source_whose_server_does_not_serve_the_policy_engine_is_refused() -> None:
    store = agl.MemoryStore()
    policy = ScriptedEngine(["policy says"], tokenizer="bytes")

    class Elsewhere:
        """A rollout source whose server is not a PolicyServer over the trainer's engine."""

        def serve(self, *args: Any, **kwargs: Any) -> Any:
            return SimpleNamespace(url="http://elsewhere", stop=lambda: None)

        def collect(self, *args: Any, **kwargs: Any) -> list[Any]:
            raise AssertionError("not reached")

        def stop(self) -> None:
            pass

    rollouts = Rollouts(policy, store, agl.Tracer(store), RolloutConfig(), SampleConfig(), source=Elsewhere())
    teacher = agl.SFT(teacher=ScriptedEngine(["t"], tokenizer="bytes"))
    with pytest.raises(RuntimeError, match="another engine cannot play the policy"):
        rollouts.step_results(agent, [(0, "t")], 0, teacher)
