"""The RL equations against hand-computed values (no model needed)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.advantages import group_advantages
from agentlightning_lite.rl.batching import Sample, collate
from agentlightning_lite.rl.config import LoggingConfig, UpdateConfig
from agentlightning_lite.rl.losses import aggregate, kl_penalty, policy_loss, value_loss
from agentlightning_lite.rl.ppo import gae

from .._helpers import grads_at_step


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
    # the shared knobs are validated once, in the base class, for both algorithms
    for algo in (agl.GRPO, agl.PPO):
        with pytest.raises(ValueError, match=rf"{algo.__name__}: unknown loss_agg 'sum'; one of token-mean"):
            algo(loss_agg="sum")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"{algo.__name__}: micro_batch_tokens must be an integer >= 1"):
            algo(micro_batch_tokens=0)
        with pytest.raises(ValueError, match=rf"{algo.__name__}: unknown kl_estimator"):
            algo(kl_estimator="k2")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=rf"{algo.__name__}: mini_batch_size"):
            algo(mini_batch_size=0)
    assert not agl.GRPO().needs_values and agl.PPO().needs_values
    assert (
        agl.PPO(lr=1e-5, value_lr=1e-3).value_head_lr() == 1e-3 and agl.PPO(lr=2e-5).value_head_lr() == 2e-5
    )
    with pytest.raises(ValueError, match="rank"):
        agl.LoRA(r=0)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error")
def test_qlora_on_cpu_is_a_clear_error() -> None:
    from agentlightning_lite.lora_settings import check_4bit_available

    with pytest.raises(RuntimeError, match="QLoRA, which needs a CUDA GPU"):
        check_4bit_available()


def test_micro_batches_bound_samples_and_padded_tokens() -> None:
    from agentlightning_lite.rl.batching import micro_batches as _micro_batches

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


def _logprob_batch() -> Any:
    a = Sample([5, 6], [7, 8], None, 1.0, "g")
    b = Sample([5, 6, 9, 10], [11], None, 0.0, "g", temperature=0.5)
    merged = Sample([3], [12, 13, 14, 15], None, 0.0, "g", parts=[a, b], offsets=[0, 3])
    samples = [
        Sample([1, 2, 3], [7, 8, 9, 10, 11], None, 1.0, "g", temperature=0.7),
        Sample([4], [9, 10], None, 0.0, "g", temperature=1.3),
        merged,
    ]
    return collate(samples, pad_id=257)


@pytest.mark.parametrize("lora", [False, True])
def test_chunked_logprobs_match_the_full_logits(tiny_llama: Any, lora: bool) -> None:
    """Chunked along the positions (a checkpointed chunk at a time), logprobs, values and every
    gradient equal those of the whole-batch logits, at temperatures != 1 and mixed in one row."""
    from agentlightning_lite.rl import batching
    from agentlightning_lite.rl.policies import ValueHead

    model = tiny_llama()
    if lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
        for n, p in model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.02)  # a live adapter, not the zero init
    else:
        model.model.embed_tokens.weight.requires_grad_(False)
    batch = _logprob_batch()
    assert batch.token_temperature is not None  # the merged row mixes 1.0 and 0.5
    mask = batch.response_mask
    torch.manual_seed(1)
    head = ValueHead(32)
    torch.nn.init.normal_(head.v.weight)
    weights = torch.randn(mask.shape)
    assert batching._decoder_and_head(model) is not None  # the chunked path is the one taken

    def run(fn: Any) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        lp, v = fn()
        ((lp * weights * mask).sum() + (v * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in [*model.named_parameters(), *head.named_parameters()]
                 if p.grad is not None}  # fmt: skip
        return lp.detach(), v.detach(), grads

    full = run(lambda: batching._forward_logprobs_full(model, batch, head, batching.nullcontext()))
    for chunk in (None, 1, 3):
        lp, v, grads = run(lambda c=chunk: batching.forward_logprobs(model, batch, head, chunk_tokens=c))
        assert torch.allclose(lp * mask, full[0] * mask, atol=1e-6, rtol=0), chunk
        assert torch.allclose(v * mask, full[1] * mask, atol=1e-6, rtol=0)
        assert grads.keys() == full[2].keys() and len(grads) > 2
        for n, g in grads.items():
            err = float((g - full[2][n]).abs().max()) / float(full[2][n].abs().max())
            assert err < 1e-5, (chunk, n, err)
    assert float((lp * (1 - mask)).abs().sum()) == 0.0  # untrained positions are not scored
    with torch.no_grad():
        lp_nograd, _ = batching.forward_logprobs(model, batch, chunk_tokens=2)
    assert torch.allclose(lp_nograd * mask, full[0] * mask, atol=1e-6, rtol=0)


def test_chunked_logprobs_keep_one_chunk_of_logits(tiny_llama: Any) -> None:
    """With gradients, the float32 logits alive at once are one chunk's, not the whole batch's: the
    tensors saved for the backward hold no ``[*, vocab]`` tensor."""
    from agentlightning_lite.rl import batching

    model = tiny_llama()
    batch = _logprob_batch()
    vocab = model.config.vocab_size

    def saved_vocab_elements(fn: Any) -> int:
        sizes: list[int] = []

        def pack(t: torch.Tensor) -> torch.Tensor:
            if t.dim() >= 1 and t.shape[-1] == vocab:
                sizes.append(t.numel())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, _ = fn()
        lp.sum().backward()
        return sum(sizes)

    full = saved_vocab_elements(
        lambda: batching._forward_logprobs_full(model, batch, None, batching.nullcontext())
    )
    chunked = saved_vocab_elements(lambda: batching.forward_logprobs(model, batch, chunk_tokens=2))
    assert full >= 2 * batch.response_ids.numel() * vocab  # logits and log_softmax of every position
    assert chunked <= vocab  # at most the output layer's weight; no logits


def _rollout(rid: str, calls: int, tokens: int) -> list[Sample]:
    return [Sample([1], [2] * tokens, None, 0.0, "g", rollout_id=rid, index=i) for i in range(calls)]


@pytest.mark.parametrize("split", [False, True])
def test_rollout_mean_weighs_every_rollout_the_same(split: bool) -> None:
    """``loss_agg="rollout-mean-token-mean"``: a rollout of 3 calls x 10 tokens gets the same share of
    the loss (and of its gradient) as a rollout of one 2-token call, wherever the micro batches cut;
    under ``"token-mean"`` the long rollout takes 30/32 of it."""
    long, short = _rollout("long", 3, 10), _rollout("short", 1, 2)
    chunks = [long[:2], [long[2], *short]] if split else [[*long, *short]]

    def shares(mode: str) -> dict[str, float]:
        algo = agl.GRPO(loss_agg=mode)  # type: ignore[arg-type]
        batches = [collate(c, pad_id=0) for c in chunks]
        token_losses = [torch.ones(b.response_mask.shape, requires_grad=True) for b in batches]
        weights = algo.loss_weights(chunks, [b.response_mask for b in batches])
        total = sum(
            aggregate(t, b.response_mask, mode, weights=w) * weight
            for t, b, (weight, w) in zip(token_losses, batches, weights, strict=True)
        )
        assert float(total) == pytest.approx(1.0)  # a mean of token losses that are all 1
        total.backward()  # type: ignore[union-attr]
        out = {"long": 0.0, "short": 0.0}
        for c, t in zip(chunks, token_losses, strict=True):
            for i, s in enumerate(c):
                out[s.rollout_id] += float(t.grad[i].sum())  # type: ignore[index]
        return out

    assert shares("rollout-mean-token-mean") == pytest.approx({"long": 0.5, "short": 0.5})
    assert shares("token-mean") == pytest.approx({"long": 30 / 32, "short": 2 / 32})
    assert shares("seq-mean-token-mean") == pytest.approx({"long": 3 / 4, "short": 1 / 4})
    with pytest.raises(ValueError, match="needs the per-token weights"):
        aggregate(torch.ones(1, 2), torch.ones(1, 2), "rollout-mean-token-mean")


@pytest.mark.parametrize("mode", ["call", "trajectory"])
def test_trainer_update_weighs_rollouts_equally(tiny_llama: Any, tmp_path: Any, mode: str) -> None:
    """Through the trainer's update: with ``rollout-mean-token-mean`` the gradient over a 4-call rollout
    and a 1-call rollout is the mean of each rollout's own token-mean gradient, whatever the micro
    batches (2 samples each here) and whether the calls are trained one by one or merged."""
    import random

    from agentlightning_lite.rl.trajectory import merge_trajectories
    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    engine = HFEngine(
        tiny_llama(),
        tokenizer=ByteTokenizer(),
        lora=agl.LoRA(r=4, alpha=8, target_modules=["q_proj"]),
        seed=0,
    )
    with torch.no_grad():
        for n, p in engine.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.02)
    rng = random.Random(0)

    def rollout(rid: str, calls: int, max_len: int) -> list[Sample]:
        prompt, out = [rng.randrange(256) for _ in range(6)], []
        for k in range(calls):
            response = [rng.randrange(256) for _ in range(rng.randint(max_len // 2, max_len))]
            out.append(Sample(list(prompt), response, None, 0.0, 0, advantage=rng.uniform(-1, 1),
                              rollout_id=rid, index=k, agent="a"))  # fmt: skip
            prompt = prompt + response + [rng.randrange(256)]
        return out

    long, short = rollout("long", 4, 12), rollout("short", 1, 3)

    def grads(samples: list[Sample], loss_agg: str) -> dict[str, torch.Tensor]:
        algo = agl.GRPO(lr=0.0, max_grad_norm=1e9, loss_agg=loss_agg, micro_batch_size=2)  # type: ignore[arg-type]
        trainer = agl.Trainer(engine=engine, algorithm=algo, store=agl.MemoryStore(), output_dir=tmp_path,
                              logging_config=LoggingConfig(loggers=[]),
                              update_config=UpdateConfig(old_logprobs="recompute"))  # fmt: skip
        trainer.sample_config.transitions = mode
        if mode == "trajectory":
            samples, _ = merge_trajectories(samples)
        with grads_at_step(trainer.learner.optimizer, trainer.policy.named_parameters()) as out:
            trainer.learner.optimise(samples)  # the step zeroes the gradients after
        trainer.close()
        return out

    both = grads(long + short, "rollout-mean-token-mean")
    g_long, g_short = grads(long, "token-mean"), grads(short, "token-mean")
    by_tokens = grads(long + short, "token-mean")
    assert len(both) > 0
    for n, g in both.items():
        expected = 0.5 * g_long[n] + 0.5 * g_short[n]
        torch.testing.assert_close(g, expected, rtol=1e-4, atol=1e-7, msg=n)
    # under token-mean the short rollout's share is its token count's: far from a half
    n = next(iter(both))
    assert not torch.allclose(by_tokens[n], both[n], rtol=1e-2, atol=0)


def test_scale_rewards_takes_trls_names() -> None:
    rewards, groups = [1.0, 0.0, 1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b", "b", "b"]
    group, _ = group_advantages(rewards, groups, scale="group")
    assert group == group_advantages(rewards, groups, scale=True)[0]
    none, _ = group_advantages(rewards, groups, scale="none")
    assert none == pytest.approx([0.5, -0.5, 0.75, -0.25, -0.25, -0.25])
    batch, _ = group_advantages(rewards, groups, scale="batch", eps=0.0)
    sd = float(torch.tensor(rewards).std())  # the std of the whole batch's rewards
    assert batch == pytest.approx([x / sd for x in none])
    with pytest.raises(ValueError, match="scale_rewards"):
        agl.GRPO(scale_rewards="std")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="zero_spread"):
        agl.GRPO(zero_spread="skip")  # type: ignore[arg-type]


def _group_samples() -> list[Sample]:
    """Task "a" with reward spread, task "b" where every rollout scored 1 (no signal)."""
    meta = {"policy": "default"}
    out = [Sample([1, 2, 3], [4 + i, 5, 6], None, float(i % 2), "a", meta=dict(meta)) for i in range(4)]
    out += [Sample([1, 2, 9], [7, 8 + i, 9, 10, 11], None, 1.0, "b", meta=dict(meta)) for i in range(4)]
    return out


def test_zero_spread_groups_are_dropped_and_counted() -> None:
    samples = _group_samples()
    stats = agl.GRPO(group_size=4).advantages(samples)
    assert stats["samples/zero_spread_dropped"] == 4.0 and stats["grpo/zero_std_groups"] == 1.0
    assert [bool(s.meta.get("masked")) for s in samples] == [False] * 4 + [True] * 4
    kept = _group_samples()
    assert "samples/zero_spread_dropped" not in agl.GRPO(group_size=4, zero_spread="keep").advantages(kept)
    assert not any(s.meta.get("masked") for s in kept)
    with_kl = _group_samples()  # the KL term still pulls on zero-advantage calls: they stay
    agl.GRPO(group_size=4, kl_coef=0.1).advantages(with_kl)
    assert not any(s.meta.get("masked") for s in with_kl)


def test_dropping_zero_spread_groups_trains_on_the_spread_groups_alone(
    tiny_llama: Any, tmp_path: Any
) -> None:
    """Through the trainer's update, ``zero_spread="drop"`` moves the adapter exactly as training on
    the groups with reward spread alone does; ``"keep"`` also runs the zero-spread calls (advantage 0)."""
    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    def weights_after(
        samples: list[Sample], zero_spread: str
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        engine = HFEngine(
            tiny_llama(),
            tokenizer=ByteTokenizer(),
            lora=agl.LoRA(r=4, alpha=8, target_modules=["q_proj"]),
            seed=0,
        )
        with torch.no_grad():
            for n, p in engine.model.named_parameters():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
        algo = agl.GRPO(group_size=4, lr=1e-2, zero_spread=zero_spread)  # type: ignore[arg-type]
        trainer = agl.Trainer(engine=engine, algorithm=algo, store=agl.MemoryStore(), output_dir=tmp_path,
                              logging_config=LoggingConfig(loggers=[]))  # fmt: skip
        stats = trainer.learner.learn(samples)
        out = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if "lora" in n}
        trainer.close()
        return out, stats

    dropped, stats = weights_after(_group_samples(), "drop")
    alone, _ = weights_after(_group_samples()[:4], "keep")
    _, kept_stats = weights_after(_group_samples(), "keep")
    assert stats["samples/zero_spread_dropped"] == 4.0 and "samples/zero_spread_dropped" not in kept_stats
    assert stats["perf/update_tokens"] < kept_stats["perf/update_tokens"]  # the dropped calls cost nothing
    for n, w in dropped.items():
        torch.testing.assert_close(w, alone[n], rtol=0, atol=0, msg=n)
