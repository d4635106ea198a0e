"""Trainer faults on a tiny random-init model (fast on CPU): resuming over rollouts a killed process
left running, agents that hang past their timeout, a single AIR rule."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

SRC = str(Path(agl.__file__).resolve().parents[1])


@pytest.fixture
def engine(tiny_engine: Any) -> Any:
    """The tiny random-init engine of tests/conftest.py, with a LoRA adapter to train."""
    return tiny_engine(lora=agl.LoRA(r=2, alpha=4))


def make(engine: Any, tmp_path: Path, **kw: Any) -> agl.Trainer:
    defaults: dict[str, Any] = dict(
        algorithm=agl.GRPO(group_size=2, lr=1e-3), batch_size=2, logging_config=LoggingConfig(loggers=[])
    )
    defaults.update(kw)
    return agl.Trainer(
        engine=engine, store=agl.SQLiteStore(tmp_path / "runs.db"), output_dir=tmp_path, **defaults
    )


CHILD = """
import sys, time
import agentlightning_lite as agl
store = agl.SQLiteStore(sys.argv[1], flush_interval=0.05)
ids = [store.start_rollout({"q": i}, mode="train").rollout_id for i in range(3)]
store.flush()
print(" ".join(ids), flush=True)
time.sleep(600)
"""


def test_resume_marks_rollouts_of_a_killed_trainer_interrupted(engine: Any, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "runs.db")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        left = proc.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    assert len(left) == 3

    trainer = make(engine, tmp_path)
    try:
        assert all(trainer.store.get_rollout(rid).status == "running" for rid in left)  # type: ignore[union-attr]
        trainer.fit(lambda task, llm: 1.0, [{"q": 0}], steps=0)  # no resume: left as they are
        assert all(trainer.store.get_rollout(rid).status == "running" for rid in left)  # type: ignore[union-attr]
        trainer.fit(lambda task, llm: 1.0, [{"q": 0}], steps=0, resume=True)
        got = [trainer.store.get_rollout(rid) for rid in left]
        assert [(r.status, r.error) for r in got] == [("failed", "interrupted")] * 3  # type: ignore[union-attr]
    finally:
        trainer.close()


def test_trainer_takes_a_single_air_rule(engine: Any, tmp_path: Path) -> None:
    rule = agl.air.ToolStatus(success=0.5)
    trainer = make(engine, tmp_path, air=rule)
    try:
        assert trainer.air == [rule]
        with pytest.raises(TypeError, match="air= rule 0 is a str"):
            make(engine, tmp_path, air=["not a rule"])
    finally:
        trainer.close()


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_hung_agents_time_out_free_their_engine_slots_and_do_not_pile_up(
    tiny_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio
    import threading
    import time

    import httpx

    # the rollouts module the trainer runs (a doctest run may have imported a second copy of it)
    run_rollouts = (
        agl.Trainer.train_step.__globals__["Rollouts"]
        .run.__globals__["InProcessRollouts"]
        .collect.__globals__["run_rollouts"]
    )
    rollouts = SimpleNamespace(**run_rollouts.__globals__)

    engine = tiny_engine(step_delay_s=0.005, no_eos=True, lora=agl.LoRA(r=2, alpha=4))
    release = threading.Event()
    before = set(rollouts.hung_threads())

    def agent(task: dict, llm: agl.LLM) -> Any:
        body = {"model": llm.model, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0}
        if task["kind"] == "sleep":  # a sync agent stuck for good
            release.wait(10**6)
            return 1.0
        if task["kind"] == "llm":  # blocked on a call that would decode for 15 s or more
            httpx.post(llm.base_url + "/chat/completions", json={**body, "max_tokens": 3000}, timeout=None)
            return 1.0
        if task["kind"] == "async":

            async def forever() -> float:
                await asyncio.sleep(10**6)
                return 1.0

            return forever()
        return 0.5  # quick (a short call would share the long call's batch and wait for it)

    tasks = [{"kind": k} for k in ("sleep", "llm", "async", "ok")]
    trainer = make(
        engine, tmp_path, rollout_config=RolloutConfig(timeout=1.5, failed_reward=0.0), batch_size=4
    )
    try:
        t0 = time.monotonic()
        out = trainer.fit(agent, tasks, steps=2)
        assert time.monotonic() - t0 < 30
        assert trainer.step == 2 and out["train/timeout_rollouts"] == 6  # training went on
        by_kind: dict[str, list[str]] = {}
        for r in trainer.store.rollouts(mode="train"):
            by_kind.setdefault(r.task["kind"], []).append(r.status)
        assert by_kind == {
            "sleep": ["timeout"] * 4,
            "llm": ["timeout"] * 4,
            "async": ["timeout"] * 4,
            "ok": ["succeeded"] * 4,
        }
        # a timed-out rollout whose reply was generating says so, with its tokens so far
        errors = [r.error or "" for r in trainer.store.rollouts(mode="train") if r.task["kind"] == "llm"]
        running = r"1 reply still generating: \S+ \(rollout [^)]+\): \d+ tokens so far"
        named = [e for e in errors if "still generating" in e]  # a call not yet started names nothing
        assert named and all(re.search(running, e) and "lower the agent's max_tokens" in e for e in named), (
            errors
        )
        sleepers = [r.error or "" for r in trainer.store.rollouts(mode="train") if r.task["kind"] == "sleep"]
        assert not any("still generating" in e for e in sleepers)  # nothing of theirs was generating
        # the blocked calls were stopped in the engine, not decoded to their 3000 tokens
        assert engine.stats["aborted"] >= 1 and engine.stats["generated_tokens"] < 4 * 3000 // 2
        # the async agents were cancelled and the blocked callers answered: only the 4 sleepers hang on,
        # as daemon threads
        assert wait_for(lambda: len(set(rollouts.hung_threads()) - before) == 4)
        left = set(rollouts.hung_threads()) - before
        assert all(t.daemon and t.is_alive() for t in left)
        # past the cap, no more rollouts start: a clear error instead of threads piling up
        cap = len(rollouts.hung_threads()) - 1
        monkeypatch.setitem(run_rollouts.__globals__, "MAX_HUNG_THREADS", cap)
        with pytest.raises(
            RuntimeError, match="agent threads are still running after their rollouts timed out"
        ):
            trainer.fit(agent, tasks, steps=3)
    finally:
        release.set()
        trainer.close()
    assert wait_for(lambda: not (set(rollouts.hung_threads()) - before))


def wait_for(cond: Any, timeout: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())
