"""``agl.RayRunners``: a local Ray cluster (2 CPUs) runs the runner workers as actors for one step."""

from __future__ import annotations

from collections.abc import Iterator

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
