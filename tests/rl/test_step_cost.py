"""What a training step no longer computes twice: shared prefixes run once (packing with a block mask),
no no-grad pass for an on-policy update, memory savers only when memory is short. Each gives the
numbers of the plain path (float tolerance)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl import update
from agentlightning_lite.rl._runtime import prepare_update_memory
from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs, micro_batches
from agentlightning_lite.rl.config import UpdateConfig
from agentlightning_lite.rl.packing import pack_prefixes, prefix_groups
from agentlightning_lite.rl.policies import ValueHead

from .._helpers import tiny_llama


def _lora_model(attn: str = "sdpa") -> Any:
    from peft import get_peft_model

    model = get_peft_model(tiny_llama(attn_implementation=attn), agl.LoRA(r=4, alpha=8).to_peft_config())
    with torch.no_grad():  # a non-zero adapter, so both LoRA matrices get gradients
        gen = torch.Generator().manual_seed(3)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


def _samples(seed: int = 0, prompt_len: tuple[int, int] = (24, 48)) -> list[Sample]:
    """Three groups of three calls sharing a long prompt (responses of different lengths: padding),
    a call sharing nothing, and a second turn whose prompt extends the first call's conversation."""
    rng = random.Random(seed)
    out = []
    for g in range(3):
        prompt = [rng.randrange(256) for _ in range(rng.randint(*prompt_len))]
        for k in range(3):
            response = [rng.randrange(256) for _ in range(rng.randint(1, 9))]
            out.append(Sample(list(prompt), response, None, float(k), g, advantage=k - 1.0, temperature=0.7))
    out.append(Sample([rng.randrange(256) for _ in range(30)], [5, 6, 7], None, 0.0, 9, advantage=0.5))
    first = out[0]
    out.append(
        Sample(first.prompt_ids + first.response_ids + [1, 2, 3], [9, 9, 4], None, 1.0, 0, advantage=1.0)
    )
    return out


def _loss_and_grads(model: Any, samples: list[Sample], share: bool, value_head: Any = None) -> Any:
    model.zero_grad(set_to_none=True)
    batch = collate(samples, 0, share_prefix=share)
    lp, values = forward_logprobs(model, batch, value_head)
    adv = torch.tensor([s.advantage for s in samples])[:, None]
    loss = -(lp * adv * batch.response_mask).sum() / batch.response_mask.sum()
    if values is not None:
        loss = loss + (values * batch.response_mask).pow(2).sum()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    if value_head is not None:
        grads |= {f"v.{n}": p.grad.clone() for n, p in value_head.named_parameters()}
        value_head.zero_grad(set_to_none=True)
    return lp.detach() * batch.response_mask, float(loss.detach()), grads, batch


def test_groups_of_shared_prefixes() -> None:
    groups = prefix_groups([[1] * 20 + [2], [3] * 5, [1] * 20 + [4, 4], [1] * 19 + [5]], min_shared=16)
    assert groups == [([0, 2, 3], 19), ([1], 0)]
    assert pack_prefixes([[1] * 5, [2] * 5], [[1], [2]], 1, pad_id=0) is None  # nothing shared: plain
    packed = pack_prefixes([[7] * 20] * 3, [[1, 2], [3], [4, 5, 6]], 3, pad_id=0)
    assert packed is not None and packed.tokens == 26 and packed.plain_tokens == 66
    # each suffix sees the prefix and itself, not its neighbours; positions continue from the prefix
    assert packed.position_ids[0].tolist() == [*range(22), 20, 20, 21, 22]
    allowed = packed.allowed[0]
    assert bool(allowed[22, :20].all()) and not bool(allowed[22, 20:22].any()) and bool(allowed[22, 22])
    assert packed.pos.tolist() == [[19, 20, 0], [19, 0, 0], [19, 23, 24]]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_prefixes_give_the_plain_logprobs_loss_and_lora_gradients(attn: str) -> None:
    model = _lora_model(attn)
    samples = _samples()
    lp_a, loss_a, grads_a, plain = _loss_and_grads(model, samples, share=False)
    lp_b, loss_b, grads_b, packed = _loss_and_grads(model, samples, share=True)
    assert plain.packed is None and packed.packed is not None
    assert packed.model_tokens < 0.5 * plain.model_tokens  # the prompts ran once per group
    # three groups (the second turn joins its conversation's group: it shares the prompt) and the lone call
    assert len(packed.packed.input_ids) == 4
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    assert loss_b == pytest.approx(loss_a, abs=1e-5)
    assert set(grads_a) == set(grads_b) and any("lora_A" in n for n in grads_a)
    for n in grads_a:
        torch.testing.assert_close(grads_b[n], grads_a[n], atol=1e-5, rtol=1e-4)


def test_packed_prefixes_give_ppo_the_plain_values() -> None:
    model = _lora_model()
    head = ValueHead(model.config.hidden_size)
    samples = _samples(seed=1)
    _, loss_a, grads_a, _ = _loss_and_grads(model, samples, share=False, value_head=head)
    _, loss_b, grads_b, _ = _loss_and_grads(model, samples, share=True, value_head=head)
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for n in grads_a:
        torch.testing.assert_close(grads_b[n], grads_a[n], atol=1e-5, rtol=1e-4)


def test_micro_batches_count_a_shared_prompt_once() -> None:
    samples = [Sample([1] * 150, [2] * 12, None, 0.0, g) for g in range(2) for _ in range(8)]
    assert [len(c) for c in micro_batches(samples, 16, 2048)] == [12, 4]  # 162 padded tokens a sample
    assert [len(c) for c in micro_batches(samples, 16, 2048, share_prefix=True)] == [16]  # 2 x (150 + 96)


def _optimise(
    model: Any, samples: list[Sample], algo: Any, cfg: update.UpdateSettings, head: Any = None
) -> Any:
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    stats = update.optimise(model, samples, algo, opt, head, cfg)
    return stats, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def _engine_samples() -> list[Sample]:
    samples = _samples(seed=2)[:9]
    for s in samples:  # engine logprobs a little off the trainer's, as a real engine's are
        s.engine_logprobs = [-3.0 - 0.01 * i for i in range(len(s.response_ids))]
    return samples


@pytest.mark.parametrize("name", ["grpo", "ppo"])
def test_an_on_policy_update_skips_the_no_grad_pass_and_gives_the_same_weights(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    algo = (
        agl.GRPO(group_size=3, micro_batch_size=4)
        if name == "grpo"
        else agl.PPO(micro_batch_size=4, epochs=1)
    )
    calls: list[bool] = []
    real = update.forward_logprobs

    def counted(*a: Any, **k: Any) -> Any:
        calls.append(torch.is_grad_enabled())
        return real(*a, **k)

    monkeypatch.setattr(update, "forward_logprobs", counted)
    results = []
    for skip in (True, False):
        monkeypatch.setattr(update, "on_policy", lambda *a, skip=skip: skip)
        torch.manual_seed(0)
        model = _lora_model()
        head = ValueHead(model.config.hidden_size) if algo.needs_values else None
        cfg = update.UpdateSettings(device=torch.device("cpu"), old_logprobs="recompute", share_prefix=False)
        calls.clear()
        stats, weights = _optimise(model, _engine_samples(), algo, cfg, head)
        no_grad = calls.count(False)
        results.append((stats, weights, no_grad))
    (s_skip, w_skip, ng_skip), (s_pass, w_pass, ng_pass) = results
    assert ng_pass == 3  # one no-grad pass per micro-batch (9 samples, 4 a micro-batch)
    assert ng_skip == (3 if algo.needs_values else 0)  # PPO's values still need one
    assert s_skip["train/old_logprobs_pass"] == 0.0 and s_pass["train/old_logprobs_pass"] == 1.0
    for n in w_pass:
        torch.testing.assert_close(w_skip[n], w_pass[n], atol=1e-6, rtol=1e-5)
    # the engine/trainer mismatch is still measured, from the gradient pass
    assert s_skip["train/logprob_mismatch_mean"] == pytest.approx(
        s_pass["train/logprob_mismatch_mean"], rel=1e-5
    )
    assert s_skip["mismatch/tokens"] == s_pass["mismatch/tokens"] > 0


def test_the_pass_runs_again_when_the_update_is_not_on_policy() -> None:
    cfg = update.UpdateSettings(device=torch.device("cpu"))
    one = [[0, 1, 2]]
    assert update.on_policy(agl.GRPO(group_size=2), one, cfg)
    assert not update.on_policy(agl.GRPO(group_size=2, epochs=2), one, cfg)  # several epochs
    assert not update.on_policy(agl.PPO(epochs=4), one, cfg)
    assert not update.on_policy(agl.GRPO(group_size=2), [[0], [1]], cfg)  # several optimizer steps
    tis = update.UpdateSettings(device=torch.device("cpu"), correction=(agl.TIS(cap=2.0),))
    assert not update.on_policy(agl.GRPO(group_size=2), one, tis)  # a correction needs pi_old / pi_engine
    engine = update.UpdateSettings(device=torch.device("cpu"), old_logprobs="engine")
    assert not update.on_policy(agl.GRPO(group_size=2), one, engine)  # the engine's logprobs, as asked
    # and a real update with two mini-batches runs it
    model = _lora_model()
    stats, _ = _optimise(
        model, _engine_samples(), agl.GRPO(group_size=3, micro_batch_size=4, mini_batch_size=4), cfg
    )
    assert stats["train/old_logprobs_pass"] == 1.0


def test_memory_savers_turn_on_only_when_memory_is_short() -> None:
    from agentlightning_lite.rl._runtime import is_checkpointing

    plenty = _lora_model()
    assert not prepare_update_memory(plenty, UpdateConfig(), micro_batch_tokens=64)
    assert not is_checkpointing(plenty.get_base_model())
    short = _lora_model()  # a budget of a millionth of the memory available: today's savers
    assert prepare_update_memory(short, UpdateConfig(memory_budget=1e-6), micro_batch_tokens=64)
    assert is_checkpointing(short.get_base_model())
    assert prepare_update_memory(
        _lora_model(), UpdateConfig(gradient_checkpointing=True), micro_batch_tokens=64
    )
    with pytest.raises(ValueError, match="memory_budget"):
        UpdateConfig(memory_budget=0)
    with pytest.raises(ValueError, match="host_mmap_threshold_mib"):
        UpdateConfig(host_mmap_threshold_mib="always")
