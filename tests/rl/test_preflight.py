"""The rollout timeout sized to the engine: ``RolloutConfig(timeout="auto")`` from a timed decoding step and
the agent's declared tokens; a set timeout below the estimate is warned about before the first rollout."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import AUTO_FLOOR_S, AUTO_MARGIN, LoggingConfig, RolloutConfig
from agentlightning_lite.rl.preflight import RolloutEstimate, estimate, fit_timeout

TASKS = [{"q": f"say {i}"} for i in range(4)]


class SlowEngine:
    """Just enough of an engine to be timed: each request decodes 16 tokens in ``seconds``."""

    def __init__(self, seconds: float, max_batch_size: int | None = None) -> None:
        self.seconds, self.widths = seconds, list[int]()
        if max_batch_size is not None:
            self.max_batch_size = max_batch_size

    def encode(self, text: str) -> list[int]:
        return list(text.encode())[:8]

    def generate(self, requests: list[Any]) -> list[Any]:
        self.widths.append(len(requests))
        time.sleep(self.seconds)
        return [SimpleNamespace(num_tokens=r.max_tokens) for r in requests]


def declaring(tokens: int, calls: list[str] | None = None) -> Any:
    """An agent that says its rollouts generate up to ``tokens`` and asks for 2."""

    def agent(task: dict, llm: agl.LLM) -> float:
        logging.getLogger("test.agent").warning("agent ran")
        reply = llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, max_tokens=2, messages=[{"role": "user", "content": task["q"]}]
        )
        return float(len(reply.choices[0].message.content or "") % 2)

    agent.max_rollout_tokens = tokens  # type: ignore[attr-defined]
    return agent


def make(engine: Any, tmp_path: Path, timeout: float | str | None) -> agl.Trainer:
    return agl.Trainer(
        engine=engine,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        rollout_config=RolloutConfig(timeout=timeout),
        logging_config=LoggingConfig(loggers=[]),
    )


def test_the_estimate_times_the_steps_width_capped_by_the_engines_batch() -> None:
    engine = SlowEngine(0.16, max_batch_size=4)
    timed: dict[int, float] = {}
    got = estimate(engine, declaring(1000), at_once=10, timed=timed)  # type: ignore[arg-type]
    assert got is not None and (got.tokens, got.at_once, got.width) == (1000, 10, 4)
    assert engine.widths == [1, 4]  # a warm-up request, then 4 decoding together
    assert 0.01 <= got.step_s < 0.1 and got.seconds == pytest.approx(1000 * got.step_s * 3)
    assert "3 batches taking turns" in got.figures() and "1000 tokens" in got.figures()
    assert estimate(engine, declaring(50), at_once=10, timed=timed).tokens == 50  # type: ignore[arg-type, union-attr]
    assert engine.widths == [1, 4]  # timed once per width
    assert estimate(engine, lambda task, llm: 1.0, at_once=10) is None  # type: ignore[arg-type]
    assert engine.widths == [1, 4]  # an agent that declares nothing: no timing


def test_auto_is_a_margin_over_the_estimate_never_below_the_floor(caplog: pytest.LogCaptureFixture) -> None:
    config = RolloutConfig()
    assert config.timeout == "auto" and config.timeout_s == AUTO_FLOOR_S  # before anything is known
    assert fit_timeout(config, RolloutEstimate(tokens=256, at_once=8, width=8, step_s=0.01)) == AUTO_FLOOR_S
    with caplog.at_level(logging.INFO, logger="agentlightning_lite.rl.preflight"):
        big = RolloutEstimate(tokens=1024, at_once=32, width=32, step_s=0.5)
        assert fit_timeout(config, big) == config.timeout_s == AUTO_MARGIN * 512
    assert "RolloutConfig(timeout='auto') -> 1536 s" in caplog.text and "1024 tokens" in caplog.text
    assert fit_timeout(config, None) == AUTO_FLOOR_S  # another agent that declares nothing
    for timeout in (None, 1000.0):  # no limit, or one above the estimate: nothing to say
        assert fit_timeout(RolloutConfig(timeout=timeout), big) == timeout
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    for bad in ("soon", 0, -1.0, True):
        with pytest.raises(ValueError, match="timeout must be 'auto', a number of seconds > 0 or None"):
            RolloutConfig(timeout=bad)


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_a_short_timeout_for_long_rollouts_is_named_before_the_first_rollout(
    tiny_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = make(tiny_engine(step_delay_s=0.01, lora=agl.LoRA(r=4, alpha=8)), tmp_path, timeout=30)
    try:
        with caplog.at_level(logging.WARNING):
            trainer.fit(declaring(1_000_000), TASKS, steps=1)
    finally:
        trainer.close()
    messages = [r.getMessage() for r in caplog.records]
    [warned] = [i for i, m in enumerate(messages) if "RolloutConfig(timeout=30)" in m]
    assert warned < messages.index("agent ran")  # said before the first rollout started
    text = messages[warned]
    assert "a rollout that generates its 1000000 tokens takes about" in text and "4 rollouts at once" in text
    for remedy in ("max_tokens", "stop string", "raise RolloutConfig(timeout=...)", "fewer rollouts"):
        assert remedy in text
    assert trainer.rollout_config.timeout_s == 30 and trainer.step == 1  # a warning: the run goes on


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_auto_scales_with_the_declared_tokens_and_trains(
    tiny_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer = make(tiny_engine(step_delay_s=0.01, lora=agl.LoRA(r=4, alpha=8)), tmp_path, timeout="auto")
    try:
        with caplog.at_level(logging.INFO, logger="agentlightning_lite.rl.preflight"):
            out = trainer.fit(declaring(100_000), TASKS, steps=1)
        assert trainer.step == 1 and out["train/rollouts"] == 4 and out["train/timeout_rollouts"] == 0
        # 100,000 tokens at >= 10 ms a step: over 1,000 s; three times that
        assert trainer.rollout_config.timeout == "auto" and (trainer.rollout_config.timeout_s or 0) > 3000
        assert "RolloutConfig(timeout='auto') ->" in caplog.text and "100000 tokens" in caplog.text
        trainer.evaluate(lambda task, llm: 1.0, TASKS)  # an agent that declares nothing: the floor
        assert trainer.rollout_config.timeout_s == AUTO_FLOOR_S
    finally:
        trainer.close()
