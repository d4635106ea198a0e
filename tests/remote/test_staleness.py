"""The off-policy guard: samples made by weights older than ``max_staleness`` updates are dropped."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import agentlightning_lite as agl

torch = pytest.importorskip("torch")
from agentlightning_lite.rl.config import RolloutConfig, SampleConfig  # noqa: E402
from agentlightning_lite.rl.rollouts import RolloutResult, RolloutSpec  # noqa: E402
from agentlightning_lite.rl.session import Rollouts  # noqa: E402


def _rollout(store: agl.MemoryStore, version: int) -> RolloutResult:
    ro = store.start_rollout("t", mode="train")
    store.add_spans(
        [
            agl.Span(
                span_id=f"s-{ro.rollout_id}",
                rollout_id=ro.rollout_id,
                kind="llm",
                name="chat",
                start_time=1.0,
                end_time=2.0,
                input=[{"role": "user", "content": "hi"}],
                output={"role": "assistant", "content": "yo"},
                attributes={"policy": True, "weights_version": version},
                prompt_token_ids=[1, 2],
                response_token_ids=[3],
                response_logprobs=[-0.1],
            )
        ]
    )
    store.finish_rollout(ro.rollout_id, reward=1.0)
    return RolloutResult(
        ro.rollout_id, RolloutSpec("t", "train", {"task_index": 0}), "succeeded", 1.0, None, 1.0
    )


@pytest.mark.parametrize(("max_staleness", "kept"), [(None, 3), (0, 1), (1, 2), (2, 3)])
def test_old_samples_are_dropped(max_staleness: int | None, kept: int) -> None:
    store = agl.MemoryStore()
    results = [_rollout(store, v) for v in (5, 4, 3)]  # the policy is at version 5
    rollouts = Rollouts(
        SimpleNamespace(version=5),  # type: ignore[arg-type]
        store,
        agl.Tracer(store),
        RolloutConfig(failed_reward="drop"),
        SampleConfig(max_seq_len=100, max_staleness=max_staleness),
    )
    samples, stats = rollouts.samples(results)
    assert len(samples) == kept
    assert stats["train/samples_stale"] == 3 - kept


def test_max_staleness_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_staleness"):
        agl.Trainer(model="x", engine=object(), sample_config=SampleConfig(max_staleness=-1))
