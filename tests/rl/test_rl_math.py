"""The RL equations against hand-computed values (no model needed)."""

from __future__ import annotations

import math

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.batching import Sample, collate
from agentlightning_lite.rl.grpo import aggregate, group_advantages, kl_penalty, policy_loss
from agentlightning_lite.rl.ppo import gae, value_loss


def test_group_advantages_normalise_within_groups() -> None:
    adv, stats = group_advantages([1.0, 0.0, 0.0, 0.5, 0.5, 2.0], ["a", "a", "a", "b", "b", "c"])
    # group a: mean 1/3, sample std sqrt(1/3); b: zero spread; c: single sample
    sd = math.sqrt(1 / 3)
    assert adv[:3] == pytest.approx([(2 / 3) / sd, -(1 / 3) / sd, -(1 / 3) / sd], rel=1e-5)
    assert adv[3:] == [0.0, 0.0, 0.0]
    assert stats == {"groups": 3.0, "zero_std_groups": 2.0, "zero_std_frac": pytest.approx(2 / 3)}
    unscaled, _ = group_advantages([1.0, 0.0], ["a", "a"], scale=False)  # Dr.GRPO: mean only
    assert unscaled == pytest.approx([0.5, -0.5])


def test_policy_loss_clips_both_sides() -> None:
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))  # ratios 1.5, 0.5, 1.1
    mask = torch.ones(1, 3)
    loss, stats = policy_loss(logp, old, torch.tensor([1.0]), mask, 0.2, 0.2)
    # A > 0: min(r A, clip(r) A) -> 1.2 (clipped), 0.5 (unclipped, pessimistic), 1.1
    assert (-loss)[0].tolist() == pytest.approx([1.2, 0.5, 1.1])
    assert float(stats["clip_frac"]) == pytest.approx(1 / 3)
    loss, _ = policy_loss(logp, old, torch.tensor([-1.0]), mask, 0.2, 0.28)
    # A < 0: min(-r, -clip(r)) -> -1.5 (unclipped), -0.8 (clipped at 1-0.2), -1.1
    assert (-loss)[0].tolist() == pytest.approx([-1.5, -0.8, -1.1])


def test_policy_gradient_direction() -> None:
    logits = torch.zeros(1, 2, 3, requires_grad=True)
    actions = torch.tensor([[0, 1]])
    logp = torch.log_softmax(logits, -1).gather(-1, actions[..., None]).squeeze(-1)
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor([1.0]), torch.ones(1, 2), 0.2, 0.2)
    aggregate(loss, torch.ones(1, 2), "token-mean").backward()
    g = logits.grad[0]
    assert g[0, 0] < 0 and g[1, 1] < 0  # descending the loss raises the chosen actions' logits


def test_kl_estimators() -> None:
    logp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.5])
    assert kl_penalty(logp, ref, "k1").tolist() == pytest.approx([0.0, -0.5])
    d = torch.tensor([0.0, 0.5])
    assert kl_penalty(logp, ref, "k3").tolist() == pytest.approx((torch.exp(d) - d - 1).tolist())
    assert (kl_penalty(torch.randn(100), torch.randn(100), "k3") >= 0).all()


def test_gae_hand_computed() -> None:
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    values = torch.tensor([[0.1, 0.2, 0.3], [0.5, 0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    # row 0: d2 = 1 - .3 = .7; d1 = .9*.3 - .2 = .07; d0 = .9*.2 - .1 = .08
    #        A2 = .7; A1 = .07 + .45*.7 = .385; A0 = .08 + .45*.385 = .25325
    assert adv[0].tolist() == pytest.approx([0.25325, 0.385, 0.7])
    # row 1 ends at t=1 (the padded value 9.0 is ignored): d1 = 2 - .5 = 1.5; d0 = .9*.5 - .5 = -.05
    assert adv[1].tolist() == pytest.approx([-0.05 + 0.45 * 1.5, 1.5, 0.0])
    assert ret[0].tolist() == pytest.approx([0.35325, 0.585, 1.0])
    v = value_loss(torch.tensor([1.0]), torch.tensor([0.0]), torch.tensor([2.0]), clip=0.2)
    assert v.tolist() == pytest.approx([0.5 * max(1.0, 1.8**2)])


def test_collate_aligns_responses() -> None:
    samples = [
        Sample([1, 2, 3], [7, 8], [-0.1, -0.2], 1.0, "g"),
        Sample([4], [9, 10, 11], None, 0.0, "g", temperature=0.5),
    ]
    b = collate(samples, pad_id=0)
    assert b.input_ids.tolist() == [[1, 2, 3, 7, 8, 0], [0, 0, 4, 9, 10, 11]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b.position_ids[1].tolist()[2:] == [0, 1, 2, 3]
    assert b.response_ids.tolist() == [[7, 8, 0], [9, 10, 11]]
    assert b.response_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert b.temperature.tolist() == [1.0, 0.5]


def test_configs_validate() -> None:
    with pytest.raises(ValueError, match="clip"):
        agl.GRPO(clip=1.5)
    with pytest.raises(ValueError, match="loss_agg"):
        agl.GRPO(loss_agg="sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gamma"):
        agl.PPO(gamma=2.0)
    with pytest.raises(ValueError, match="rank"):
        agl.LoRA(r=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_qlora_on_cpu_is_a_clear_error() -> None:
    from agentlightning_lite.rl.lora import check_4bit_available

    with pytest.raises(RuntimeError, match="QLoRA, which needs a CUDA GPU"):
        check_4bit_available()


def test_micro_batches_bound_samples_and_padded_tokens() -> None:
    from agentlightning_lite.rl.trainer import _micro_batches

    def s(p: int, r: int) -> Sample:
        return Sample([1] * p, [2] * r, None, 0.0, "g")

    samples = [s(10, 5), s(10, 5), s(30, 10), s(5, 5), s(5, 5), s(5, 5)]
    chunks = _micro_batches(samples, most=3, max_tokens=60)
    # [15, 15] fits (2 x 15 = 30); adding the 40-token one would pad 3 x 40 = 120 > 60
    assert [len(c) for c in chunks] == [2, 1, 3]
    assert [x for c in chunks for x in c] == samples
    for c in chunks:
        width = max(len(x.prompt_ids) for x in c) + max(len(x.response_ids) for x in c)
        assert len(c) <= 3 and (len(c) == 1 or len(c) * width <= 60)
