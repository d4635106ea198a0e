"""Runners against a served queue: rollouts with their spans, reconnecting, a runner SIGKILLed mid-step."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import Runner

from .conftest import start_runner


def test_a_runner_runs_the_queued_rollouts_with_their_spans(
    served: Callable[..., agl.RemoteRunners], agent_file: str
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key="k")
    with Runner(agent_file, runners.url, api_key="k", workers=3):
        jobs = runners.run([({"q": f"{i}+{i}?"}, "train", {"i": i}) for i in range(6)])
    assert [j.status for j in jobs] == ["succeeded"] * 6 and [j.reward for j in jobs] == [1.0] * 6
    assert len({j.rollout_id for j in jobs}) == 6
    for j in jobs:
        ro = store.get_rollout(j.rollout_id)
        assert ro.status == "succeeded" and ro.reward == 1.0 and ro.metadata["remote"] is True
        kinds = [s.kind for s in store.spans(j.rollout_id)]
        assert sorted(kinds) == ["llm", "reward", "tool"]
    [t] = agl.transitions(store, rollout_ids=[jobs[0].rollout_id])
    assert t.prompt_token_ids and t.response_token_ids and t.reward == 1.0


def test_a_failing_agent_fails_its_rollout_and_the_runner_goes_on(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store)

    def agent(task: str, llm: agl.LLM) -> float:
        if task == "boom":
            raise RuntimeError("tool exploded")
        return 0.5

    with Runner(agent, runners.url, workers=1):
        jobs = runners.run([("boom", "train", {}), ("fine", "train", {})])
    assert [(j.status, j.reward) for j in jobs] == [("failed", None), ("succeeded", 0.5)]
    assert "tool exploded" in (store.get_rollout(jobs[0].rollout_id).error or "")


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_runners_reconnect_when_the_trainer_restarts(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    first = served(store)
    port = first.server.port
    runner = Runner(lambda task, llm: 1.0, first.url, workers=2, claim_wait=1.0).start()
    try:
        assert [j.status for j in first.run([("a", "train", {})])] == ["succeeded"]
        first.server.stop()  # the trainer goes away (killed, restarting)...
        time.sleep(1.5)  # ... runners keep retrying meanwhile
        second = served(store, port=port)  # ... and comes back on the same port, with a fresh queue
        jobs = second.run([("b", "train", {}), ("c", "train", {})])
        assert [j.status for j in jobs] == ["succeeded", "succeeded"]
        assert runner.client.reconnects >= 1
    finally:
        runner.stop(timeout=5)


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_runner_killed_mid_step_loses_no_rollout(
    served: Callable[..., agl.RemoteRunners], agent_file: str
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key="k", lease_timeout=1.5, max_attempts=3)
    n = 8
    specs = [({"q": "2+2?", "sleep": 0.6}, "train", {"i": i}) for i in range(n)]
    victim = start_runner(runners.url, agent_file, "--workers", "2", api_key="k")
    survivor = start_runner(runners.url, agent_file, "--workers", "2", api_key="k")
    done: list[agl.remote.queue.Job] = []
    killed = threading.Event()

    def on_done(job: agl.remote.queue.Job) -> None:
        done.append(job)
        if len(done) == 2 and not killed.is_set():  # the step is under way: kill one runner
            victim.send_signal(signal.SIGKILL)
            killed.set()

    try:
        t0 = time.monotonic()
        jobs = runners.run(specs, on_done=on_done)
        elapsed = time.monotonic() - t0
    finally:
        for p in (victim, survivor):
            p.kill()
            p.wait(10)
    assert killed.is_set() and victim.returncode == -signal.SIGKILL
    assert len(jobs) == n and [j.status for j in jobs] == ["succeeded"] * n
    assert len(done) == n and len({j.job_id for j in done}) == n  # each counted once
    assert [j.reward for j in jobs] == [1.0] * n
    counted = {j.rollout_id for j in jobs}
    all_ros = store.rollouts()
    lost = [r for r in all_ros if r.rollout_id not in counted]
    # what the killed runner held is in the store, failed (lease expired), and was retried elsewhere
    assert all(r.status == "failed" and "lease expired" in (r.error or "") for r in lost)
    assert sum(j.attempts for j in jobs) == n + len(lost)
    assert elapsed < 60
