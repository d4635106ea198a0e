"""``agl.RayRunners``: a local Ray cluster (2 CPUs) runs the runner workers as actors for one step."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.engines import ScriptedEngine

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # the actors are small (a runner each); Ray's memory monitor judges the whole machine, and would
    # kill them when other programs on a shared machine hold most of its memory
    monkeypatch.setenv("RAY_memory_monitor_refresh_ms", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_actors_run_one_step_of_rollouts(local_ray: None, agent_file: str) -> None:
    store = agl.MemoryStore()
    runners = agl.RayRunners(
        num_workers=4, workers_per_actor=2, agent=agent_file, api_key="k", actor_options={"num_cpus": 1}
    )
    runners.serve(ScriptedEngine(["The answer is 4."], tokenizer="bytes"), store)
    try:
        runners.start_workers(None)
        assert len(runners.actors) == 2
        jobs = runners.run([({"q": "2+2?"}, "train", {"i": i}) for i in range(6)])
        workers = {store.get_rollout(j.rollout_id).metadata["worker"].split("/")[0] for j in jobs}
    finally:
        server = runners.server
        runners.stop()
        server.stop()
    assert [j.status for j in jobs] == ["succeeded"] * 6 and [j.reward for j in jobs] == [1.0] * 6
    assert workers <= {"ray-actor-0", "ray-actor-1"} and workers
    assert all(len(store.spans(j.rollout_id)) == 3 for j in jobs)
    assert runners.actors == []


VARIED_AGENT = '''
import random, time

def agent(task, llm):
    """One call, a slow tool, a second call; a random reward (a spread in every GRPO group)."""
    for text in (task["q"], task["q"] + " Again."):
        llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, max_tokens=4, messages=[{"role": "user", "content": text}])
        time.sleep(0.1)
    return random.random()
'''


def test_asynchronous_training_on_ray_actors(local_ray: None, tiny_engine: Any, tmp_path: Path) -> None:
    """``RolloutConfig(async_rollouts=True)`` with ``agl.RayRunners``: the actors roll out the next
    step while the learner updates; every step's rollouts come back to it, all succeed, each call
    records the version that served it (at most one behind its step) and the adapter changes."""
    import torch

    from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig, SampleConfig

    from .._helpers import lora_weights

    (tmp_path / "varied_agent.py").write_text(VARIED_AGENT)
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = agl.Trainer(
        engine=engine,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path / "run",
        logging_config=LoggingConfig(loggers=[]),
        runners=agl.RayRunners(
            num_workers=4,
            workers_per_actor=2,
            agent=f"{tmp_path / 'varied_agent.py'}:agent",
            actor_options={"num_cpus": 1},
        ),
        rollout_config=RolloutConfig(async_rollouts=True),
        sample_config=SampleConfig(max_staleness=1),
    )
    before = {k: v.clone() for k, v in lora_weights(trainer.policy).items()}
    try:
        out = trainer.fit(lambda task, llm: 0.0, [{"q": f"Say a word about {i}."} for i in range(8)], steps=3)
        ros = trainer.store.rollouts(mode="train")
        assert trainer.step == 3 and engine.version == 3
        assert len(ros) == 12 and all(r.status == "succeeded" for r in ros)
        assert {r.metadata["worker"].split("/")[0] for r in ros} <= {"ray-actor-0", "ray-actor-1"}
        for r in ros:
            versions = [
                s.attributes["weights_version"] for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"
            ]
            assert len(versions) == 2 and all(
                r.metadata["step"] - 1 <= v <= r.metadata["step"] for v in versions
            )
        assert out["async/staleness_max"] <= 1 and out["train/samples"] == 8
        after = lora_weights(trainer.policy)
        assert any(not torch.equal(before[k], after[k]) for k in before)
    finally:
        trainer.close()
    assert trainer.runners.actors == []
