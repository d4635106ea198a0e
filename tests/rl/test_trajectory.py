"""Trajectory mode: a multi-turn episode trained as one sequence gives the per-call loss and gradient."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.batching import Sample, collate
from agentlightning_lite.rl.config import LoggingConfig, SampleConfig, UpdateConfig
from agentlightning_lite.rl.trajectory import merge_trajectories
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import grads_at_step


@pytest.fixture
def engine(tiny_llama: Any) -> Iterator[Any]:
    from agentlightning_lite.serving.engines import HFEngine

    eng = HFEngine(
        tiny_llama(),
        tokenizer=ByteTokenizer(),
        lora=agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
        seed=0,
        model_name="tiny",
    )
    with torch.no_grad():  # a non-zero adapter, so the LoRA B matrices get a gradient too
        for n, p in eng.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    yield eng
    eng.close()


def episode(
    rng: random.Random, turns: int, rollout: str = "r0", agent: str | None = "solver"
) -> list[Sample]:
    """A chat-like episode: each call's prompt is the previous prompt + response + a new observation
    (none after the second call: two responses back to back, which must still be two calls)."""
    prompt = [rng.randrange(0, 256) for _ in range(rng.randint(5, 9))]
    out = []
    for k in range(turns):
        response = [rng.randrange(0, 256) for _ in range(rng.randint(2, 6))]
        out.append(
            Sample(
                list(prompt),
                response,
                [-rng.random() for _ in response],
                reward=rng.uniform(-1, 1),
                group=0,
                temperature=[1.0, 0.7, 1.3][k % 3],
                advantage=rng.uniform(-1, 1),
                rollout_id=rollout,
                index=k,
                agent=agent,
            )
        )
        gap = 0 if k == 1 else rng.randint(1, 4)
        prompt = prompt + response + [rng.randrange(0, 256) for _ in range(gap)]
    return out


def loss_and_grads(trainer: agl.Trainer, samples: list[Sample], mode: str) -> tuple[dict[str, float], dict]:
    trainer.sample_config.transitions = mode
    if mode == "trajectory":
        samples, _ = merge_trajectories(samples)
    named = list(trainer.policy.named_parameters())
    if trainer.value_head is not None:
        named += [(f"v.{n}", p) for n, p in trainer.value_head.named_parameters()]
    with grads_at_step(trainer.learner.optimizer, named) as grads:  # the step zeroes them after
        stats = trainer.learner.optimise(samples)
    return stats, dict(grads)


@pytest.mark.parametrize(
    "algorithm",
    [
        agl.GRPO(lr=0.0, max_grad_norm=1e9, loss_agg="token-mean"),
        agl.GRPO(lr=0.0, max_grad_norm=1e9, loss_agg="seq-mean-token-mean", kl_coef=0.1),
        agl.GRPO(lr=0.0, max_grad_norm=1e9, loss_agg="seq-mean-token-sum-norm"),
        agl.PPO(lr=0.0, value_lr=0.0, max_grad_norm=1e9, epochs=1, gamma=0.9, lam=0.8),
    ],
    ids=["grpo-token-mean", "grpo-seq-mean-kl", "grpo-sum-norm", "ppo"],
)
def test_merged_and_per_call_give_the_same_loss_and_gradient(
    engine: Any, tmp_path: Path, algorithm: Any
) -> None:
    trainer = agl.Trainer(
        engine=engine,
        algorithm=algorithm,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
        update_config=UpdateConfig(old_logprobs="recompute"),
    )
    rng = random.Random(1)
    samples = episode(rng, 4) + episode(rng, 3, rollout="r1")
    if isinstance(algorithm, agl.PPO):  # a non-zero value head, so the values (and GAE) matter
        with torch.no_grad():
            trainer.value_head.v.weight.normal_(0, 0.1)  # type: ignore[union-attr]
    per_call, g_call = loss_and_grads(trainer, samples, "call")
    merged, g_merged = loss_and_grads(trainer, samples, "trajectory")
    assert per_call["train/sequences"] == 7 and merged["train/sequences"] == 2
    assert merged["train/response_tokens"] == per_call["train/response_tokens"]
    assert merged["train/sequence_tokens"] < per_call["train/sequence_tokens"] / 2
    assert merged["train/loss"] == pytest.approx(per_call["train/loss"], rel=1e-4, abs=1e-6)
    assert merged["train/pg_loss"] == pytest.approx(per_call["train/pg_loss"], rel=1e-4, abs=1e-6)
    if isinstance(algorithm, agl.PPO):
        assert merged["ppo/value_loss"] == pytest.approx(per_call["ppo/value_loss"], rel=1e-4)
    assert set(g_call) == set(g_merged) and len(g_call) > 0
    total = torch.cat([g.flatten() for g in g_call.values()]).abs().max()
    assert total > 0
    for n, g in g_call.items():
        torch.testing.assert_close(g_merged[n], g, rtol=1e-3, atol=1e-6 * float(total), msg=n)
    trainer.close()


def test_masks_cover_exactly_the_generated_tokens() -> None:
    rng = random.Random(3)
    calls = episode(rng, 5)
    (merged,), stats = merge_trajectories(calls)
    assert merged.prompt_ids == calls[0].prompt_ids
    assert merged.prompt_ids + merged.response_ids == calls[-1].prompt_ids + calls[-1].response_ids
    mask, segs = merged.token_mask(), merged.token_segments()
    trained = [t for t, m in zip(merged.response_ids, mask, strict=True) if m]
    assert trained == [t for c in calls for t in c.response_ids]
    for k, c in enumerate(calls, 1):  # each segment is exactly one call's response, with its credit
        pos = [i for i, s in enumerate(segs) if s == k]
        assert [merged.response_ids[i] for i in pos] == c.response_ids
        assert pos == list(range(pos[0], pos[0] + len(c.response_ids)))
        assert {merged.token_advantages()[i] for i in pos} == {c.advantage}
        assert merged.token_rewards()[pos[-1]] == c.reward and all(
            merged.token_rewards()[i] == 0.0 for i in pos[:-1]
        )
        assert [merged.token_engine_logprobs()[i] for i in pos] == c.engine_logprobs  # type: ignore[index]
    context = [i for i, m in enumerate(mask) if not m]
    assert all(segs[i] == 0 and merged.token_advantages()[i] == 0.0 for i in context)
    assert len(context) == len(merged.response_ids) - sum(len(c.response_ids) for c in calls)
    b = collate([merged, calls[0]], pad_id=257)
    assert b.response_mask[0, : len(mask)].tolist() == mask and b.response_mask[0, len(mask) :].sum() == 0
    assert b.response_mask[1].sum() == len(calls[0].response_ids)
    assert stats == {
        "trajectory/calls": 5.0,
        "trajectory/sequences": 1.0,
        "trajectory/merged_calls": 4.0,
        "trajectory/prefix_mismatches": 0.0,
    }


def test_a_mismatched_prefix_falls_back_to_separate_samples() -> None:
    rng = random.Random(5)
    calls = episode(rng, 4)
    # call 2's history was summarised: its prompt no longer starts with call 1's prompt + response
    calls[2].prompt_ids = [1, 2, 3, *calls[2].prompt_ids[-4:]]
    calls[3].prompt_ids = calls[2].prompt_ids + calls[2].response_ids + [9]
    other_agent = episode(random.Random(6), 2, agent="critic")  # same rollout, another agent: own chain
    out, stats = merge_trajectories(calls + other_agent)
    assert stats["trajectory/prefix_mismatches"] == 1.0
    assert stats["trajectory/merged_calls"] == 3.0  # 0+1, 2+3, critic 0+1
    assert stats["trajectory/sequences"] == 3.0
    by_first = {(s.agent, (s.parts or [s])[0].index): s for s in out}
    assert [p.index for p in by_first[("solver", 0)].parts] == [0, 1]  # type: ignore[union-attr]
    assert [p.index for p in by_first[("solver", 2)].parts] == [2, 3]  # type: ignore[union-attr]
    assert [p.agent for p in by_first[("critic", 0)].parts] == ["critic", "critic"]  # type: ignore[union-attr]
    # a one-token change anywhere in the shared prefix is enough to fall back
    calls = episode(random.Random(7), 2)
    calls[1].prompt_ids[0] ^= 1
    out, stats = merge_trajectories(calls)
    assert len(out) == 2 and all(s.parts is None for s in out) and stats["trajectory/prefix_mismatches"] == 1


@pytest.mark.parametrize("dropped", ["thinking", "tail"])
def test_a_history_that_drops_part_of_a_response_is_never_merged(dropped: str) -> None:
    tok = ByteTokenizer()
    header = "<|im_start|>assistant\n"
    p1 = tok.encode(f"<|im_start|>user\nWeather in Paris?<|im_end|>\n{header}")
    if dropped == "thinking":  # Qwen3's template drops earlier turns' <think>...</think> from the history
        r1 = tok.encode("<think>\nAsk the tool.\n</think>\n\n<tool_call>get_weather</tool_call><|im_end|>")
        kept = tok.encode("<tool_call>get_weather</tool_call><|im_end|>")
    else:  # the history keeps the response's first tokens only: a long shared prefix, still not exact
        r1 = tok.encode("<tool_call>get_weather</tool_call> and more<|im_end|>")
        kept = r1[:-10] + tok.encode("<|im_end|>")
    obs = tok.encode(f"\n<|im_start|>user\n<tool_response>sunny</tool_response><|im_end|>\n{header}")
    p2 = p1 + kept + obs
    r2 = tok.encode("Sunny.<|im_end|>")
    p3 = p2 + r2 + tok.encode(f"\n<|im_start|>user\nThanks<|im_end|>\n{header}")  # call 3 extends call 2
    r3 = tok.encode("Welcome.<|im_end|>")
    assert p2[: len(p1)] == p1 and p2[: len(p1 + r1)] != p1 + r1  # the prompt kept, the response not whole
    calls = [
        Sample(p, r, None, reward=float(k), group=0, advantage=float(k) - 1, rollout_id="r0", index=k)
        for k, (p, r) in enumerate([(p1, r1), (p2, r2), (p3, r3)])
    ]
    out, stats = merge_trajectories(calls)
    assert stats["trajectory/prefix_mismatches"] == 1.0  # the split is counted
    assert stats["trajectory/merged_calls"] == 1.0 and stats["trajectory/sequences"] == 2.0
    first, rest = sorted(out, key=lambda s: len(s.prompt_ids))
    # call 1 trains alone, on exactly its own tokens
    assert first.parts is None and (first.prompt_ids, first.response_ids) == (p1, r1)
    assert first.token_mask() == [1.0] * len(r1)
    # calls 2 and 3 merge: the sequence is call 3's prompt + response, call 1's response is not in it
    assert [c.index for c in rest.parts or []] == [1, 2]
    assert rest.prompt_ids + rest.response_ids == p3 + r3
    assert rest.prompt_ids == p2
    mask = rest.token_mask()
    trained = [t for t, m in zip(rest.response_ids, mask, strict=True) if m]
    assert trained == r2 + r3


def test_trainer_rejects_an_unknown_transitions_mode(engine: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="transitions must be 'call' or 'trajectory'"):
        agl.Trainer(
            engine=engine,
            store=agl.MemoryStore(),
            output_dir=tmp_path,
            sample_config=SampleConfig(transitions="episode"),
        )


@pytest.mark.parametrize("first_cut", ["keep", "mask"])
def test_a_merged_trajectory_longer_than_max_tokens_keeps_its_later_turns(first_cut: str) -> None:
    """Three calls that each used their whole ``max_tokens`` merge into one sample whose response is
    longer than any call may generate; nothing cuts it there: the last turn's tokens are trained. With the
    first call cut and masked (``SampleConfig(truncated="mask")``), the later turns still train."""
    from agentlightning_lite.rl.batching import trained

    max_tokens = 8
    rng = random.Random(3)
    calls = episode(rng, 3)
    prompt = calls[0].prompt_ids
    for k, s in enumerate(calls):  # every reply exactly max_tokens long, each prompt extending the last
        s.prompt_ids = list(prompt)
        s.response_ids = [rng.randrange(0, 256) for _ in range(max_tokens)]
        s.engine_logprobs = [-1.0] * max_tokens
        prompt = prompt + s.response_ids + [rng.randrange(0, 256) for _ in range(3)]
        s.meta = {"truncated": True, "masked": True} if (k == 0 and first_cut == "mask") else {}
    merged, stats = merge_trajectories(trained(calls))
    (sample,) = merged
    kept = calls[1:] if first_cut == "mask" else calls
    assert stats["trajectory/merged_calls"] == len(kept) - 1 and stats["trajectory/prefix_mismatches"] == 0
    assert len(sample.response_ids) > max_tokens and sum(sample.token_mask()) == max_tokens * len(kept)
    batch = collate(merged, pad_id=0)
    mask = batch.response_mask[0]
    assert int(mask.sum()) == max_tokens * len(kept) and batch.response_len == len(sample.response_ids)
    last = calls[-1]
    start = len(last.prompt_ids) - len(sample.prompt_ids)
    assert batch.response_ids[0, start:].tolist() == last.response_ids  # the last turn, whole
    assert mask[start:].tolist() == [1.0] * max_tokens
    assert batch.segment_ids is not None and set(batch.segment_ids[0, start:].tolist()) == {len(kept)}
