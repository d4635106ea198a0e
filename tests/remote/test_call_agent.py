"""One way to call an agent: the same agent behaves the same in the trainer's process and under a runner.

Each agent below runs once through the in-process path (``run_rollouts``, the trainer's threads) and
once through the runner path (``agl.remote.Runner`` claiming from a real server on 127.0.0.1); the
rollout each leaves in the store (status, reward, error) must be the same, and as expected.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.agent import LitAgent, call_agent
from agentlightning_lite.rl.rollouts import RolloutSpec, hung_threads, run_rollouts

from .conftest import SRC

TIMEOUT = 1.5
EVENTS: list[str] = []  # what the agents saw (cancellation), per run
RELEASE = threading.Event()  # lets the hanging sync agent end


def sync_agent(task: str, llm: agl.LLM) -> float:
    return 1.0


async def async_agent(task: str, llm: agl.LLM) -> float:
    await asyncio.sleep(0)
    return 0.5


class ModeAgent(LitAgent):
    def rollout(self, task: str, llm: agl.LLM) -> float:
        return 0.25

    def validation_rollout(self, task: str, llm: agl.LLM) -> float:
        return 0.75


def emits_then_none(task: str, llm: agl.LLM) -> None:
    agl.emit_reward(0.6)
    return None


def raises(task: str, llm: agl.LLM) -> float:
    raise ValueError(f"cannot do {task}")


async def async_overruns(task: str, llm: agl.LLM) -> float:
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        EVENTS.append("cancelled")
        raise
    return 1.0


def sync_overruns(task: str, llm: agl.LLM) -> float:
    RELEASE.wait(30)
    agl.emit_reward(1.0)  # too late: dropped
    EVENTS.append("sync agent ended")
    return 1.0


def asks_the_policy(task: str, llm: agl.LLM) -> float:
    from openai import OpenAI  # the agent's own client, from base_url and api_key alone

    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    reply = client.chat.completions.create(model=llm.model, messages=[{"role": "user", "content": task}])
    return float("4" in (reply.choices[0].message.content or ""))


TIMED_OUT = ("timeout", None, f"TimeoutError: no result within {TIMEOUT} s")
CASES: list[tuple[str, Any, str, tuple[str, float | None, str | None]]] = [
    ("sync", sync_agent, "train", ("succeeded", 1.0, None)),
    ("async", async_agent, "train", ("succeeded", 0.5, None)),
    ("litagent-train", ModeAgent(), "train", ("succeeded", 0.25, None)),
    ("litagent-val", ModeAgent(), "val", ("succeeded", 0.75, None)),
    ("none-after-emit_reward", emits_then_none, "train", ("succeeded", 0.6, None)),
    ("raises", raises, "train", ("failed", None, "ValueError: cannot do 2+2?")),
    ("async-times-out", async_overruns, "train", TIMED_OUT),
    ("sync-times-out", sync_overruns, "train", TIMED_OUT),
    ("calls-the-policy", asks_the_policy, "train", ("succeeded", 1.0, None)),
]


def _in_process(runners: agl.RemoteRunners, agent: Any, mode: str, timeout: float) -> agl.Rollout:
    """The trainer's path: one rollout thread, its LLM endpoint on the same server."""
    server = runners.server
    tracer = agl.Tracer(server.store)
    [res] = run_rollouts(agent, [RolloutSpec("2+2?", mode)], tracer, server.llm, timeout=timeout)
    ro = server.store.get_rollout(res.rollout_id)
    assert ro is not None and res.status == ro.status
    return ro


def _runner(runners: agl.RemoteRunners, agent: Any, mode: str, timeout: float) -> agl.Rollout:
    """The runner's path: the rollout queued on the server, claimed and run by ``agl.remote.Runner``."""
    with agl.remote.Runner(agent, runners.url, max_rollouts=1, claim_wait=0.5) as runner:
        [job] = runners.run([("2+2?", mode, {})])
        if agent is not sync_overruns:  # that one keeps its worker busy until it returns
            assert runner.join(TIMEOUT + 10)
    ro = runners.server.store.get_rollout(job.rollout_id)
    assert ro is not None and job.status == ro.status
    return ro


@pytest.mark.parametrize("path", ["in-process", "runner"])
@pytest.mark.parametrize(("name", "agent", "mode", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_same_agent_behaves_the_same_in_process_and_under_a_runner(
    served: Callable[..., agl.RemoteRunners],
    path: str,
    name: str,
    agent: Any,
    mode: str,
    expected: tuple[str, float | None, str | None],
) -> None:
    timeout = TIMEOUT if "times-out" in name else 60.0  # (the others finish well before)
    runners = served(agl.MemoryStore(), rollout_timeout=timeout)
    EVENTS.clear()
    RELEASE.clear()
    t0 = time.monotonic()
    try:
        ro = (_in_process if path == "in-process" else _runner)(runners, agent, mode, timeout)
        took = time.monotonic() - t0
    finally:
        RELEASE.set()
    assert (ro.status, ro.reward, ro.error) == expected
    assert ro.mode == mode
    if name == "async-times-out":
        assert EVENTS == ["cancelled"]  # cancelled at its await, in both paths
    if "times-out" in name:
        assert took < TIMEOUT + 3  # the step does not wait for the agent
    if name == "sync-times-out":  # it ends on its own later; what it records then is dropped
        deadline = time.monotonic() + 10
        while "sync agent ended" not in EVENTS and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)
        again = runners.server.store.get_rollout(ro.rollout_id)
        assert (again.status, again.reward) == ("timeout", None)
        assert [s for s in runners.server.store.spans(ro.rollout_id) if s.kind == "reward"] == []
        for t in hung_threads():
            t.join(5)


def test_call_agent_refuses_a_class_and_what_is_not_an_agent() -> None:
    with pytest.raises(TypeError, match="not the class ModeAgent"):
        call_agent(ModeAgent, "t", None)
    with pytest.raises(TypeError, match="an agent is a function"):
        call_agent(42, "t", None)

    class Duck:  # an object with the LitAgent methods (as Agent Lightning's), not a subclass
        def rollout(self, task: str, llm: Any) -> float:
            return 0.0

        def validation_rollout(self, task: str, llm: Any) -> float:
            return 1.0

    assert (call_agent(Duck(), "t", None, "train"), call_agent(Duck(), "t", None, "val")) == (0.0, 1.0)


def test_the_agent_module_and_the_runner_import_no_torch() -> None:
    code = (
        "import sys\n"
        "import agentlightning_lite as agl\n"
        "import agentlightning_lite.agent, agentlightning_lite.remote.worker\n"
        "assert agl.LitAgent is agentlightning_lite.agent.LitAgent\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules)\n"
        "print(heavy)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": SRC}, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def hangs_on_the_first_task(task: str, llm: agl.LLM) -> float:
    if task == "hang":
        RELEASE.wait(30)
        EVENTS.append("sync agent ended")
    return 1.0


def test_a_runner_keeps_its_workers_when_a_sync_agent_overruns(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    """One worker; its sync agent hangs past the timeout on the first rollout: that rollout times out,
    a new worker thread takes the hung one's place and runs the next two while the hung agent is
    still blocked; once it returns, its thread ends, and join() never waited for it."""
    runners = served(agl.MemoryStore(), rollout_timeout=TIMEOUT)
    EVENTS.clear()
    RELEASE.clear()
    runner = agl.remote.Runner(hangs_on_the_first_task, runners.url, workers=1, claim_wait=0.5).start()
    try:
        t0 = time.monotonic()
        [hung] = runners.run([("hang", "train", {})])
        rest = runners.run([("a", "train", {}), ("b", "train", {})])
        took = time.monotonic() - t0
        assert hung.status == "timeout"
        assert [j.status for j in rest] == ["succeeded", "succeeded"]
        assert took < TIMEOUT + 8 and EVENTS == []  # done while the first agent is still blocked
        assert runner.stuck == 1
        stuck = [t for t in threading.enumerate() if t.name == "agl-runner-0"]
        assert len(stuck) == 1 and stuck[0].is_alive()
    finally:
        RELEASE.set()
    stuck[0].join(10)
    assert not stuck[0].is_alive() and EVENTS == ["sync agent ended"]  # it left once its agent returned
    runner.stop()
    assert runner.join(5)
