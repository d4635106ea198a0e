"""One configuration style: the knob groups, each default written once; an old one-by-one keyword
raises a TypeError that names its group."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.algorithm import RolloutOnly, WeightUpdate, rollout_only
from agentlightning_lite.rl.config import MOVED, LoggingConfig, RolloutConfig, SampleConfig, resolve


def test_groups_are_taken_as_given_without_a_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        groups = resolve({"rollout_config": RolloutConfig(timeout=60)})
    assert groups["rollout_config"].timeout == 60 and groups["sample_config"] == SampleConfig()


def test_an_old_keyword_raises_a_type_error_naming_its_new_place(tmp_path: Path) -> None:
    msg = r"Trainer\(rollout_timeout=\.\.\.\) moved: use rollout_config=RolloutConfig\(timeout=\.\.\.\)"
    with pytest.raises(TypeError, match=msg):
        agl.Trainer(output_dir=tmp_path, rollout_timeout=60)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"loggers=\.\.\.\) moved: use logging_config=LoggingConfig\(loggers"):
        agl.Trainer(output_dir=tmp_path, loggers=[], rollout_config=RolloutConfig())  # type: ignore[call-arg]
    keep = r"keep_checkpoints=\.\.\.\) moved: use checkpoint_config=CheckpointConfig\(keep="
    with pytest.raises(TypeError, match=keep):
        agl.Trainer(output_dir=tmp_path, keep_checkpoints=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'rollout_timout'"):
        agl.Trainer(output_dir=tmp_path, rollout_timout=60)  # type: ignore[call-arg]
    assert set(MOVED) >= {
        "rollout_timeout",
        "concurrency",
        "eval_every",
        "transitions",
        "gradient_checkpointing",
    }


def test_a_trainer_reads_its_knobs_from_the_groups(tiny_engine: Any, tmp_path: Path) -> None:
    trainer = agl.Trainer(
        engine=tiny_engine(),
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        batch_size=2,
        rollout_config=RolloutConfig(timeout=5),
        logging_config=LoggingConfig(loggers=[]),
    )
    try:
        config = trainer.rollout_config
        assert config.timeout == 5 and config.concurrency == 2 * trainer.algorithm.group_size
        trainer.rollout_config.timeout = 7  # one spelling: the group's knob
        assert trainer.rollout_config.timeout == 7 and trainer.rollouts.config is trainer.rollout_config
        assert trainer.learner.sample_config is trainer.sample_config
        assert not hasattr(trainer, "rollout_timeout") and not hasattr(trainer, "concurrency")
    finally:
        trainer.close()


def test_each_algorithm_says_what_the_step_needs() -> None:
    grpo, ppo, sft = agl.GRPO(kl_coef=0.1), agl.PPO(), agl.SFT(min_reward=1.0, teacher="t")
    assert all(isinstance(a, WeightUpdate) and a.updates_weights for a in (grpo, ppo, sft))
    assert (grpo.needs_values, grpo.needs_reference, grpo.min_reward, grpo.rollout_engine()) == (
        False, True, None, None,
    )  # fmt: skip
    assert ppo.needs_values and not ppo.needs_reference
    assert (sft.needs_values, sft.min_reward, sft.rollout_engine()) == (False, 1.0, "t")
    apo = agl.APO(budget=4)
    assert isinstance(apo, RolloutOnly) and not apo.updates_weights and rollout_only(apo) is apo
    assert rollout_only(grpo) is None
