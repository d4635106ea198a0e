"""The trainer's parts: knob groups, the timed phases of a step, rollout sources, the layering of rl/."""

from __future__ import annotations

import inspect
import random
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import (
    MOVED,
    LoggingConfig,
    RolloutConfig,
    SampleConfig,
    UpdateConfig,
    resolve,
)
from agentlightning_lite.rl.rollouts import RolloutResult, RolloutSpec
from agentlightning_lite.rl.sources import InProcessRollouts, RolloutSource

SRC = Path(agl.__file__).parent
TASKS = [{"q": f"Say something about {i}."} for i in range(4)]


def varied(task: dict, llm: agl.LLM) -> float:
    """One short call; a random reward, so every GRPO group has a spread and the step updates."""
    llm.openai_client().chat.completions.create(
        model=llm.model, max_tokens=4, messages=[{"role": "user", "content": task["q"]}]
    )
    return random.random()


def make(engine: Any, tmp_path: Path, **kw: Any) -> agl.Trainer:
    options: dict[str, Any] = dict(
        algorithm=agl.GRPO(group_size=2, lr=1e-3), batch_size=2, logging_config=LoggingConfig(loggers=[])
    )
    options.update(kw)
    return agl.Trainer(engine=engine, store=agl.MemoryStore(), output_dir=tmp_path, **options)


def test_knobs_come_as_one_group_each_and_the_old_keywords_are_not_parameters() -> None:
    params = inspect.signature(agl.Trainer.__init__).parameters
    for group in ("rollout_config", "sample_config", "update_config", "checkpoint_config", "logging_config"):
        assert params[group].default is None
    assert not set(MOVED) & set(params)  # each default is written once, in its group
    groups = resolve({})
    assert groups["checkpoint_config"].keep == 3 and isinstance(groups["sample_config"], SampleConfig)
    given = RolloutConfig(timeout=7.0)
    assert resolve({"rollout_config": given})["rollout_config"] is given
    with pytest.raises(TypeError, match="update_config must be"):
        resolve({"update_config": {"old_logprobs": "engine"}})


def test_a_group_given_as_an_object_is_the_trainers(tiny_engine: Any, tmp_path: Path) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(
        engine,
        tmp_path,
        rollout_config=RolloutConfig(timeout=9.0, failed_reward=0.0),
        update_config=UpdateConfig(old_logprobs="recompute"),
    )
    # the groups are the trainer's (read and set there); concurrency defaults to a whole step's rollouts
    rollouts, update = trainer.rollout_config, trainer.update_config
    assert (rollouts.timeout, rollouts.failed_reward, update.old_logprobs) == (9.0, 0.0, "recompute")
    assert trainer.rollout_config.concurrency == 4 and trainer.rollouts.config is trainer.rollout_config
    trainer.rollout_config.timeout = 3.0
    assert trainer.rollouts.config.timeout == 3.0
    with pytest.raises(TypeError, match=r"old_logprobs=\.\.\.\) moved: use update_config=UpdateConfig"):
        make(engine, tmp_path, old_logprobs="engine", update_config=UpdateConfig())
    trainer.close()


def test_a_step_times_its_phases(tiny_engine: Any, tmp_path: Path) -> None:
    random.seed(1)
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, algorithm=agl.GRPO(group_size=2, lr=1e-3, kl_coef=0.1))
    out = trainer.fit(varied, TASKS, steps=1)
    assert "train/skipped_update" not in out and engine.version == 1
    for phase in ("rollouts", "samples", "old_logprobs", "ref_logprobs", "advantages", "update", "weights"):
        assert out[f"timing/{phase}"] >= 0.0, phase
    assert out["timing/rollouts"] > 0 and out["timing/update"] > 0 and out["timing/old_logprobs"] > 0
    # the phases are parts of the step: the update's own share is within the step's update time
    assert out["timing/update"] + out["timing/old_logprobs"] <= out["time/update_s"]
    trainer.close()


class Seeing(agl.GRPO):
    """GRPO, keeping the step context each update is given."""

    seen: ClassVar[list[Any]] = []

    def update(self, ctx: Any, policy: Any, samples: list[Any]) -> dict[str, float]:
        self.seen.append(ctx)
        return super().update(ctx, policy, samples)


def test_an_algorithm_sees_a_step_context_not_the_learner(tiny_engine: Any, tmp_path: Path) -> None:
    from agentlightning_lite.rl.algorithm import StepContext
    from agentlightning_lite.rl.learner import Learner

    random.seed(2)
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, algorithm=Seeing(group_size=2, lr=1e-3), batch_size=1)
    Seeing.seen.clear()
    out = trainer.fit(varied, TASKS, steps=2)
    assert [type(c) for c in Seeing.seen] == [StepContext, StepContext]
    assert [c.step for c in Seeing.seen] == [0, 1] and not any(isinstance(c, Learner) for c in Seeing.seen)
    assert Seeing.seen[1].merged is False and Seeing.seen[1].seed == 0
    assert out["timing/advantages"] > 0 and out["timing/update"] > 0  # the context's timer is the step's
    assert not hasattr(trainer.learner, "step") and not hasattr(trainer.learner, "timer")
    trainer.close()


def test_no_algorithm_module_imports_the_learner_not_even_for_types() -> None:
    """The algorithms get a StepContext; nothing they import leads back to the learner."""
    learner = re.compile(r"^\s*from \.learner import", re.MULTILINE)
    for name in ("algorithm", "grpo", "ppo", "sft", "policy_gradient", "update", "advantages"):
        assert not learner.search((SRC / "rl" / f"{name}.py").read_text()), name


class CountingSource:
    """A rollout source of its own: the in-process one, counting what the trainer asks of it."""

    def __init__(self, tracer: agl.Tracer) -> None:
        self.inner = InProcessRollouts(tracer, RolloutConfig(concurrency=4))
        self.calls: list[str] = []

    def serve(
        self, engine: Any, store: Any, rollout_timeout: float | None = None, server_options: Any = None
    ) -> Any:
        self.calls.append("serve")
        return self.inner.serve(engine, store, rollout_timeout, server_options)

    def collect(
        self, agent: Any, specs: Sequence[RolloutSpec], progress: Callable[[], None] | None = None
    ) -> list[RolloutResult]:
        self.calls.append(f"collect {len(specs)}")
        return self.inner.collect(agent, specs, progress)

    def stop(self) -> None:
        self.calls.append("stop")
        self.inner.stop()


def test_the_trainer_runs_rollouts_through_the_source_it_is_given(tiny_engine: Any, tmp_path: Path) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    store = agl.MemoryStore()
    source = CountingSource(agl.Tracer(store))
    assert isinstance(source, RolloutSource)
    trainer = agl.Trainer(
        engine=engine,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=store,
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
        runners=source,
    )
    out = trainer.fit(varied, TASKS, steps=2, val_dataset=TASKS[:3])
    assert source.calls == ["serve", "collect 4", "collect 4", "collect 3", "stop"]
    assert out["train/rollouts"] == 4.0 and "val/reward_mean" in out
    with pytest.raises(TypeError, match="runners must be"):
        agl.Trainer(
            engine=engine,
            store=agl.MemoryStore(),
            output_dir=tmp_path,
            logging_config=LoggingConfig(loggers=[]),
            runners=object(),
        )
    trainer.close()


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_rl_imports_nothing_from_remote_and_its_agent_side_no_torch() -> None:
    code = (
        "import sys\n"
        "import agentlightning_lite.rl.rollouts\n"
        "assert 'torch' not in sys.modules, 'rl.rollouts pulled in torch'\n"
        "import agentlightning_lite.rl.trainer\n"
        "bad = sorted(m for m in sys.modules if m.startswith('agentlightning_lite.remote'))\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    upward = re.compile(r"^\s*(from|import)\s+(\.\.remote|agentlightning_lite\.remote)", re.MULTILINE)
    for path in (SRC / "rl").glob("*.py"):
        assert not upward.search(path.read_text()), path.name


def test_every_rl_module_stays_under_600_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in (SRC / "rl").glob("*.py")}
    assert max(sizes.values()) <= 600, sizes


def test_an_agents_client_waits_as_long_as_its_rollout_may_run(tiny_engine: Any, tmp_path: Path) -> None:
    """The endpoint an agent gets carries the rollout's time limit, and the clients made from it wait
    that long, not the OpenAI SDK's 600 s: on a loaded CPU a step's queued requests outlast 600 s while
    the rollout still has time, and every such rollout failed with ``APITimeoutError``."""
    seen: list[tuple[float | None, float]] = []

    def agent(task: dict, llm: agl.LLM) -> float:
        client = llm.openai_client()
        seen.append((llm.timeout, _seconds(client.timeout)))
        client.chat.completions.create(
            model=llm.model, max_tokens=2, messages=[{"role": "user", "content": task["q"]}]
        )
        return random.random()

    trainer = make(
        tiny_engine(lora=agl.LoRA(r=2, alpha=4)), tmp_path, rollout_config=RolloutConfig(timeout=1234.0)
    )
    trainer.fit(agent, TASKS[:2], steps=1)
    trainer.close()
    assert seen and all(pair == (1234.0, 1234.0) for pair in seen), seen
    assert _seconds(agl.LLM(base_url="http://127.0.0.1:1/v1", model="m").openai_client().timeout) == 600.0
    told = agl.LLM(base_url="http://127.0.0.1:1/v1", model="m", timeout=5.0)
    assert _seconds(told.openai_client(timeout=9.0).timeout) == 9.0  # what the agent asks for wins
    assert _seconds(told.openai_client().timeout) == 5.0


def _seconds(timeout: Any) -> float:
    """A client's read timeout: a number, or an ``httpx.Timeout`` (the SDK's default)."""
    return float(timeout) if isinstance(timeout, (int, float)) else float(timeout.read)
