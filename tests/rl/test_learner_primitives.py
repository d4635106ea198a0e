"""The learner's Tinker primitives: the losses (sum-reduced, Tinker's definitions and defaults), datums,
``forward_backward`` / ``forward`` / ``optim_step`` on a real trainer over the tiny Llama, and a GRPO
step written on them giving the trainer's own GRPO update's LoRA weights."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl import losses
from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.rl.datum import AdamParams, Datum, collate_datums, datum_from_sample
from agentlightning_lite.rl.primitives import LossBatch, combine_metrics
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import lora_weights, max_abs_diff, tiny_llama

# -- the losses -----------------------------------------------------------------------------------


def _grad(fn: Any, lp: list[float], *args: Any, **kw: Any) -> tuple[float, list[float]]:
    x = torch.tensor(lp, requires_grad=True)
    loss = fn(x, *args, **kw)
    loss.backward()
    return float(loss.detach()), x.grad.tolist()  # type: ignore[union-attr]


def test_cross_entropy_is_the_weighted_sum_of_negative_logprobs() -> None:
    value, grad = _grad(losses.cross_entropy, [-1.0, -2.0, -0.5], torch.tensor([1.0, 0.0, -2.0]))
    assert value == pytest.approx(1.0 * 1.0 + 0.0 - 2.0 * 0.5)  # not normalised: a sum
    assert grad == [-1.0, 0.0, 2.0]


def test_ppo_clips_the_ratio_between_its_thresholds_with_tinkers_defaults() -> None:
    old = torch.log(torch.tensor([0.5, 0.5, 0.5, 0.5]))
    lp = [float(torch.log(torch.tensor(p))) for p in (0.7, 0.3, 0.3, 0.7)]  # r = 1.4, 0.6, 0.6, 1.4
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0])
    value, grad = _grad(losses.ppo, lp, old, adv)
    # A > 0: min(1.4, 1.2) = 1.2 (clipped, no gradient); min(0.6, 0.8) = 0.6 (unclipped)
    # A < 0: min(-0.6, -0.8) = -0.8 (clipped); min(-1.4, -1.2) = -1.4 (unclipped)
    assert value == pytest.approx(-(1.2 + 0.6 - 0.8 - 1.4), abs=1e-6)
    assert grad == pytest.approx([0.0, -0.6, 0.0, 1.4], abs=1e-6)  # d(-r A)/d lp = -r A where unclipped
    wider, _ = _grad(losses.ppo, lp, old, adv, clip_low_threshold=0.5, clip_high_threshold=1.5)
    assert wider == pytest.approx(-(1.4 + 0.6 - 0.6 - 1.4), abs=1e-6)


def test_importance_sampling_and_cispo_gradients() -> None:
    old = torch.tensor([-1.0, -1.0])
    adv = torch.tensor([2.0, -1.0])
    lp = [-1.0 + float(torch.log(torch.tensor(6.0))), -1.0]  # r = 6, 1
    value, grad = _grad(losses.importance_sampling, lp, old, adv)
    assert value == pytest.approx(-(6 * 2.0 - 1.0), rel=1e-5)
    assert grad == pytest.approx([-12.0, 1.0], rel=1e-5)
    # CISPO: the clipped ratio (default [0, 4]) weighs -A * lp, with no gradient of its own
    value, grad = _grad(losses.cispo, lp, old, adv)
    assert value == pytest.approx(-(4 * 2.0 * lp[0] + 1 * -1.0 * lp[1]), rel=1e-5)
    assert grad == pytest.approx([-8.0, 1.0], rel=1e-5)


def test_builtin_loss_names_what_is_wrong() -> None:
    lp = torch.zeros(2)
    with pytest.raises(ValueError, match="unknown loss 'dro'"):
        losses.builtin_loss("dro", lp, {})
    with pytest.raises(ValueError, match=r"missing \['advantages'\]"):
        losses.builtin_loss("ppo", lp, {"logprobs": lp})
    with pytest.raises(ValueError, match="'clip' is not valid for 'ppo'"):
        losses.builtin_loss("ppo", lp, {"logprobs": lp, "advantages": lp}, {"clip": 0.2})
    with pytest.raises(ValueError, match="must be a number"):
        losses.builtin_loss("cispo", lp, {"logprobs": lp, "advantages": lp}, {"clip_high": "4"})


def test_grpo_and_ppo_import_their_losses_from_the_one_home() -> None:
    from agentlightning_lite.rl import grpo, ppo

    assert grpo.policy_loss is losses.policy_loss and grpo.aggregate is losses.aggregate
    assert grpo.kl_penalty is losses.kl_penalty and ppo.value_loss is losses.value_loss


# -- datums -----------------------------------------------------------------------------------------


def test_datum_checks_its_inputs() -> None:
    with pytest.raises(ValueError, match="'target_tokens'"):
        Datum([1, 2], {"weights": [1.0, 1.0]})
    with pytest.raises(ValueError, match=r"loss_fn_inputs\['weights'\] must be 1-D with one entry per"):
        Datum([1, 2], {"target_tokens": [2, 3], "weights": [1.0]})
    with pytest.raises(ValueError, match="mask must have one entry"):
        Datum([1, 2], {"target_tokens": [2, 3]}, mask=[1.0])
    with pytest.raises(ValueError, match="temperature must be finite and > 0"):
        Datum([1, 2], {"target_tokens": [2, 3]}, temperature=0.0)
    with pytest.raises(ValueError, match="non-empty list of token ids"):
        Datum([], {"target_tokens": []})
    with pytest.raises(ValueError, match="not a numeric array"):
        Datum([1], {"target_tokens": [2], "weights": ["a"]})


def _samples() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for g in range(2):
        prompt = [rng.randrange(256) for _ in range(20)]
        for k in range(3):
            response = [rng.randrange(256) for _ in range(rng.randint(2, 7))]
            lps = [-rng.uniform(0.5, 5.0) for _ in response]
            out.append(Sample(list(prompt), response, lps, float(k), g, temperature=0.8, advantage=k - 1.0))
    return out


@pytest.mark.parametrize("share_prefix", [False, True])
def test_datums_of_samples_collate_to_the_samples_own_batch(share_prefix: bool) -> None:
    a = Sample([1, 2, 3], [4, 5], [-1.0, -2.0], 1.0, "g", temperature=0.7)
    b = Sample([1, 2, 3, 4, 5, 6], [7], [-0.5], 0.0, "g", temperature=1.3)
    merged = Sample([1, 2, 3], [4, 5, 6, 7], None, 0.0, "g", parts=[a, b], offsets=[0, 3])
    for samples in (_samples(), [*_samples()[:2], merged]):
        want = collate(samples, 257, share_prefix)
        got, inputs = collate_datums(
            [datum_from_sample(s) for s in samples], 257, share_prefix, ["advantages"]
        )
        for field in ("input_ids", "attention_mask", "position_ids", "response_ids", "response_mask"):
            assert torch.equal(getattr(got, field), getattr(want, field)), field
        temps = (
            (got.token_temperature, want.token_temperature)
            if merged in samples
            else (got.temperature, want.temperature)
        )
        assert temps[0] is not None and temps[1] is not None and torch.equal(temps[0], temps[1])
        assert (got.packed is None) == (want.packed is None)
        if want.packed is not None and got.packed is not None:
            assert torch.equal(got.packed.input_ids, want.packed.input_ids)
            assert torch.equal(got.packed.pos, want.packed.pos)
        adv = torch.zeros(want.response_mask.shape)
        for i, s in enumerate(samples):
            adv[i, : len(s.response_ids)] = torch.tensor(s.token_advantages())
        assert torch.equal(inputs["advantages"], adv)


def test_metrics_combine_by_their_reduction() -> None:
    parts = [{"loss:sum": 1.0, "r:mean": 2.0, "r:max": 3.0}, {"loss:sum": 0.5, "r:mean": 4.0, "r:max": 1.0}]
    assert combine_metrics(parts) == {"loss:sum": 1.5, "r:mean": 3.0, "r:max": 3.0}
    with pytest.raises(ValueError, match="'ratio' must be 'name:reduction'"):
        combine_metrics([{"ratio": 1.0}])
    with pytest.raises(ValueError, match="'x:median' must be"):
        combine_metrics([{"x:median": 1.0}])


# -- the learner's primitives -------------------------------------------------------------------------


def _trainer(tmp_path: Path, algorithm: Any = None) -> agl.Trainer:
    from agentlightning_lite.serving.engines import HFEngine

    lora = agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    engine = HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=lora, seed=0)
    with torch.no_grad():  # a live adapter (both LoRA matrices get gradients), the same in every trainer
        gen = torch.Generator().manual_seed(3)
        for n, p in sorted(engine.model.named_parameters()):
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return agl.Trainer(
        engine=engine, algorithm=algorithm or agl.GRPO(group_size=3), store=agl.MemoryStore(),
        output_dir=tmp_path, logging_config=LoggingConfig(loggers=[]),
    )  # fmt: skip


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[agl.Trainer]:
    t = _trainer(tmp_path)
    yield t
    t.close()


def _lora_grads(trainer: agl.Trainer) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in trainer.policy.named_parameters() if p.grad is not None}


def test_forward_backward_returns_logprobs_and_the_summed_loss_and_accumulates(trainer: agl.Trainer) -> None:
    learner = trainer.learner
    a = Datum.from_tokens([104, 105, 106, 107, 108], weights=[0.0, 1.0, 1.0, 0.5])
    b = Datum.from_tokens([50, 51, 52], weights=[2.0, -1.0])
    fwd = learner.forward([a, b])
    assert "loss:sum" not in fwd.metrics and all(p.grad is None for p in trainer.policy.parameters())
    # the logprobs are the model's: log_softmax of its logits at each position, for the target token
    with torch.no_grad():
        logits = trainer.policy(input_ids=torch.tensor([a.model_input])).logits[0].float()
    want = torch.log_softmax(logits, -1).gather(-1, a.loss_fn_inputs["target_tokens"][:, None]).squeeze(-1)
    torch.testing.assert_close(fwd.loss_fn_outputs[0]["logprobs"], want, atol=1e-5, rtol=1e-5)
    assert fwd.loss_fn_outputs[1]["logprobs"].shape == (2,)

    out = learner.forward_backward([a, b], "cross_entropy")
    total = sum(
        float(-(d.loss_fn_inputs["weights"] * o["logprobs"]).sum())
        for d, o in zip([a, b], out.loss_fn_outputs, strict=True)
    )
    assert out.metrics["loss:sum"] == pytest.approx(total, rel=1e-5)  # a sum over tokens, not a mean
    both = _lora_grads(trainer)
    assert both and any("lora_A" in n for n in both)
    learner.optim_step(AdamParams(learning_rate=0.0))  # lr 0: no change; the gradients are zeroed
    assert all(p.grad is None for p in trainer.policy.parameters())
    learner.forward_backward([a], "cross_entropy")
    learner.forward_backward([b], "cross_entropy")  # added to a's
    assert max_abs_diff(_lora_grads(trainer), both) < 1e-6


def test_optim_step_is_adamw_with_the_settings_given(trainer: agl.Trainer) -> None:
    learner = trainer.learner
    engine = trainer.learner.weights.engine
    batch = [Datum.from_tokens([104, 105, 106, 107], weights=[1.0, 1.0, 1.0])]
    before, version = lora_weights(trainer.policy), engine.version
    learner.forward_backward(batch, "cross_entropy")
    grads = _lora_grads(trainer)
    adam = AdamParams(
        learning_rate=0.01, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1, grad_clip_norm=0.05
    )
    metrics = learner.optim_step(adam)
    norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()]))
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5) and float(norm) > 0.05
    # the same step by hand: clip to norm 0.05, then torch's AdamW with these settings
    params = {n: torch.nn.Parameter(w.clone()) for n, w in before.items()}
    for n, p in params.items():
        p.grad = grads[n] * (0.05 / (float(norm) + 1e-6))
    ref = torch.optim.AdamW(list(params.values()), lr=0.01, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    ref.step()
    assert max_abs_diff(lora_weights(trainer.policy), {n: p.detach() for n, p in params.items()}) < 1e-6
    assert engine.version == version + 1  # the engine serves the new weights
    with pytest.raises(TypeError, match="AdamParams"):
        learner.optim_step({"learning_rate": 1e-4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="beta2 must be in"):
        AdamParams(beta2=1.0)


def test_custom_losses_and_clear_errors(trainer: agl.Trainer) -> None:
    learner = trainer.learner
    batch = [Datum.from_tokens([104, 105, 106], weights=[1.0, 1.0], bonus=[0.5, 2.0]) for _ in range(3)]

    def custom(lb: LossBatch) -> tuple[torch.Tensor, dict[str, float]]:
        return -(lb.inputs["bonus"] * lb.logprobs).sum(), {"bonus:max": float(lb.inputs["bonus"].max())}

    out = learner.forward_backward(batch, custom)
    ce = learner.forward(batch, "cross_entropy").metrics["loss:sum"]
    assert out.metrics["bonus:max"] == 2.0
    lps = [o["logprobs"] for o in out.loss_fn_outputs]
    assert out.metrics["loss:sum"] == pytest.approx(
        sum(float(-(torch.tensor([0.5, 2.0]) * lp).sum()) for lp in lps)
    )
    assert ce == pytest.approx(sum(float(-lp.sum()) for lp in lps), rel=1e-5)
    with pytest.raises(ValueError, match="unknown loss 'dpo'"):
        learner.forward_backward(batch, "dpo")
    with pytest.raises(ValueError, match=r"needs loss_fn_inputs\['logprobs'\], which datum 0 lacks"):
        learner.forward_backward(batch, "ppo")
    with pytest.raises(ValueError, match="metric key 'n' must be"):
        learner.forward_backward(batch, lambda lb: (lb.logprobs.sum(), {"n": 1.0}))
    with pytest.raises(FloatingPointError, match="non-finite loss"):
        learner.forward_backward(batch, lambda lb: lb.logprobs.sum() / 0.0)
    with pytest.raises(TypeError, match="non-empty list of Datum"):
        learner.forward_backward(batch[0], "cross_entropy")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no policy 'writer'"):
        learner.forward(batch, policy="writer")


def test_a_mask_scores_only_its_positions(trainer: agl.Trainer) -> None:
    full = Datum.from_tokens([104, 105, 106, 107, 108], weights=[0.0, 0.0, 1.0, 1.0])
    masked = Datum(full.model_input, full.loss_fn_inputs, mask=[0.0, 0.0, 1.0, 1.0])
    a, b = (trainer.learner.forward([d], "cross_entropy") for d in (full, masked))
    lp_a, lp_b = a.loss_fn_outputs[0]["logprobs"], b.loss_fn_outputs[0]["logprobs"]
    assert torch.isnan(lp_b[:2]).all() and not torch.isnan(lp_a).any()  # unscored: NaN, never a number
    torch.testing.assert_close(lp_b[2:], lp_a[2:], atol=1e-5, rtol=1e-5)
    assert b.metrics["loss:sum"] == pytest.approx(a.metrics["loss:sum"], rel=1e-5)


# -- GRPO on the primitives ---------------------------------------------------------------------------


def test_a_grpo_step_through_the_primitives_gives_the_trainers_grpo_weights(tmp_path: Path) -> None:
    """GRPO's update (token-mean, clip 0.2 / clip-high 0.28, on-policy) equals, in LoRA weights, the
    Tinker recipe: each sample a datum whose advantages are divided by the step's trained tokens, the
    ``ppo`` loss with thresholds 0.8 and 1.28 against the policy's own logprobs, then one AdamW step
    with GRPO's settings."""
    algo = agl.GRPO(group_size=3, clip=0.2, clip_high=0.28, lr=5e-3, weight_decay=0.01, max_grad_norm=0.5)
    ours, tinker = _trainer(tmp_path / "a", algo), _trainer(tmp_path / "b", algo)
    try:
        assert max_abs_diff(lora_weights(ours.policy), lora_weights(tinker.policy)) == 0.0
        samples = _samples()
        start = lora_weights(ours.policy)
        stats = ours.learner.optimise(samples)
        assert stats["train/old_logprobs_pass"] == 0.0  # on-policy, as the recipe below

        n_tokens = sum(len(s.response_ids) for s in samples)
        datums = []
        for s in samples:  # token-mean: each trained token's advantage over the step's trained tokens
            d = datum_from_sample(s)
            inputs = {**d.loss_fn_inputs, "advantages": d.loss_fn_inputs["advantages"] / n_tokens}
            datums.append(Datum(d.model_input, inputs, mask=d.mask, temperature=d.temperature))
        current = tinker.learner.forward(datums)  # the policy's logprobs: the ratio's denominator
        datums = [
            Datum(
                d.model_input,
                {**d.loss_fn_inputs, "logprobs": o["logprobs"].nan_to_num()},
                d.mask,
                d.temperature,
            )
            for d, o in zip(datums, current.loss_fn_outputs, strict=True)
        ]
        out = tinker.learner.forward_backward(
            datums, "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
        )
        step = tinker.learner.optim_step(
            AdamParams(
                learning_rate=5e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, grad_clip_norm=0.5
            )
        )
        assert step["grad_norm"] == pytest.approx(stats["train/grad_norm"], rel=1e-4)
        assert out.metrics["loss:sum"] == pytest.approx(stats["train/loss"], rel=1e-4, abs=1e-6)
        assert max_abs_diff(lora_weights(tinker.policy), start) > 1e-3  # the step changed the weights...
        assert max_abs_diff(lora_weights(tinker.policy), lora_weights(ours.policy)) < 1e-6  # ...the same way
    finally:
        ours.close()
        tinker.close()


def test_the_datum_logprobs_are_the_updates_own(trainer: agl.Trainer) -> None:
    """The logprobs ``forward`` returns for a sample's datum are those GRPO's update computes for the
    sample (same batch layout, temperature included)."""
    samples = _samples()
    out = trainer.learner.forward([datum_from_sample(s) for s in samples])
    with torch.no_grad():
        lp, _ = forward_logprobs(trainer.policy, collate(samples, trainer.learner.pad_id))
    for i, (s, o) in enumerate(zip(samples, out.loss_fn_outputs, strict=True)):
        torch.testing.assert_close(
            o["logprobs"][len(s.prompt_ids) - 1 :], lp[i, : len(s.response_ids)], atol=1e-5, rtol=1e-5
        )
