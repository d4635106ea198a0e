"""Off-policy correction (TIS, masked IS) and the train/inference mismatch metrics, against values
computed by hand; old_logprobs="auto" decides per call."""

from __future__ import annotations

import contextlib
import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl import update
from agentlightning_lite.rl.config import UpdateConfig
from agentlightning_lite.rl.correction import correction_weights, mismatch_metrics, parse_correction

OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.2, -0.3, 0.0, 0.0]])
ENG = torch.tensor([[-1.5, -1.0, -0.5, 0.0], [-1.2, -1.3, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])  # 3 and 2 trained tokens
# log rho = old - engine: row 0 [0.5, -1, 0], row 1 [1, 1]


def _round(w: torch.Tensor) -> list[list[float]]:
    return [[round(float(x), 4) for x in row] for row in w]


def test_tis_weight_is_the_ratio_capped() -> None:
    w, stats = correction_weights(agl.TIS(cap=2.0), OLD, ENG, MASK)
    e = math.e
    # min(e^0.5, 2) = 1.6487, e^-1 = 0.3679, 1; row 1: min(e, 2) = 2 twice; padding 0
    assert _round(w) == [[round(e**0.5, 4), round(1 / e, 4), 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]
    assert stats["clipped_n"] == 2 and stats["clipped"] == pytest.approx(2 / 5) and stats["masked"] == 0


def test_masked_is_drops_tokens_outside_the_band() -> None:
    w, stats = correction_weights(agl.MaskedIS(low=0.5, high=2.0), OLD, ENG, MASK)
    # rho: 1.6487 in, 0.3679 < 0.5 out, 1 in; 2.718 > 2 out twice
    assert _round(w) == [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert stats["masked_n"] == 3 and stats["masked"] == pytest.approx(3 / 5)


def test_sequence_masked_is_decides_on_the_geometric_mean() -> None:
    w, stats = correction_weights(agl.MaskedIS(low=0.5, high=2.0, level="sequence"), OLD, ENG, MASK)
    # row 0: exp((0.5 - 1 + 0) / 3) = 0.8465, kept; row 1: exp((1 + 1) / 2) = 2.718, dropped
    assert _round(w) == [[1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]]
    assert stats["masked_n"] == 2
    # a narrower band drops row 0 too: 0.8465 < 0.9
    w2, _ = correction_weights(agl.MaskedIS(low=0.9, high=1.1, level="sequence"), OLD, ENG, MASK)
    assert float(w2.sum()) == 0.0


def test_corrections_multiply() -> None:
    both = (agl.TIS(cap=1.5), agl.MaskedIS(low=0.5, high=3.0))
    w, stats = correction_weights(both, OLD, ENG, MASK)
    # TIS: [1.5, 0.3679, 1], [1.5, 1.5]; the mask drops 0.3679 (< 0.5)
    assert _round(w) == [[1.5, 0.0, 1.0, 0.0], [1.5, 1.5, 0.0, 0.0]]
    assert (stats["clipped_n"], stats["masked_n"]) == (3, 1)


def test_the_config_checks_its_corrections() -> None:
    assert UpdateConfig().correction == ()
    assert UpdateConfig(correction=[agl.TIS(), agl.MaskedIS()]).correction == (agl.TIS(), agl.MaskedIS())
    assert parse_correction(agl.TIS(cap=3.0)) == (agl.TIS(cap=3.0),)
    with pytest.raises(TypeError):
        UpdateConfig(correction="tis")
    with pytest.raises(ValueError):
        agl.TIS(cap=0.5)
    with pytest.raises(ValueError):
        agl.MaskedIS(low=1.2, high=2.0)
    with pytest.raises(ValueError):
        agl.MaskedIS(level="call")  # type: ignore[arg-type]


def test_mismatch_metrics_by_hand() -> None:
    d = torch.tensor([0.5, -1.0, 0.0, 1.0, 1.0])
    m = mismatch_metrics([d[:3], d[3:]])
    rho = [math.exp(x) for x in d.tolist()]
    k3 = sum(r - 1 - x for r, x in zip(rho, d.tolist(), strict=True)) / 5  # mean(rho - 1 - log rho)
    assert m["mismatch/kl_k3"] == pytest.approx(k3)
    assert m["mismatch/ratio_mean"] == pytest.approx(sum(rho) / 5)
    # sorted rho: e^-1, 1, e^0.5, e, e; linear interpolation at 0.05*4 = 0.2 and 0.95*4 = 3.8
    s = sorted(rho)
    assert m["mismatch/ratio_p5"] == pytest.approx(s[0] + 0.2 * (s[1] - s[0]))
    assert m["mismatch/ratio_p50"] == pytest.approx(math.exp(0.5))
    assert m["mismatch/ratio_p95"] == pytest.approx(math.e)
    assert m["mismatch/tokens"] == 5
    assert mismatch_metrics([]) == {}


def _reference(monkeypatch: Any, old_logprobs: str, correction: tuple[Any, ...] = ()) -> Any:
    """``_reference`` on one micro-batch of two calls whose recomputation is OLD and engine ENG,
    except call 0's engine logprobs, which agree with the recomputation."""
    monkeypatch.setattr(update, "forward_logprobs", lambda *a, **k: (OLD.clone(), None))
    model = SimpleNamespace(eval=lambda: None, disable_adapter=contextlib.nullcontext)
    eng = [OLD[0, :3].tolist(), ENG[1, :2].tolist()]
    chunks = [[SimpleNamespace(token_engine_logprobs=lambda e=e: e) for e in eng]]
    batches = [SimpleNamespace(response_mask=MASK, input_ids=torch.zeros(2, 6))]
    cfg = update.UpdateSettings(device=torch.device("cpu"), old_logprobs=old_logprobs, correction=correction)
    return update._reference(model, chunks, batches, agl.GRPO(group_size=2), None, cfg)  # type: ignore[arg-type]


def test_auto_checks_every_call_and_falls_back_where_they_disagree(monkeypatch: Any) -> None:
    ref = _reference(monkeypatch, "auto")
    assert (ref.calls, ref.fallbacks, ref.engine_share) == (2, 1, 0.5)
    assert torch.equal(ref.old_lp[0], OLD)  # call 0: the engine's (equal); call 1: the recomputation
    assert ref.weights == [None]
    eng_only = _reference(monkeypatch, "engine")
    assert eng_only.engine_share == 1.0 and float(eng_only.old_lp[0][1, 0]) == pytest.approx(-1.2)


def test_a_correction_takes_the_ratio_against_the_recomputation(monkeypatch: Any) -> None:
    ref = _reference(monkeypatch, "engine", (agl.TIS(cap=2.0),))  # the correction overrides "engine"
    assert torch.equal(ref.old_lp[0], OLD) and ref.engine_share == 0.0
    # call 0 agrees (weight 1), call 1: rho = e, capped at 2
    assert _round(ref.weights[0]) == [[1.0, 1.0, 1.0, 0.0], [2.0, 2.0, 0.0, 0.0]]
    assert ref.clipped_n == 2
    m = mismatch_metrics(ref.log_rhos)
    assert m["mismatch/tokens"] == 5 and m["mismatch/ratio_p50"] == pytest.approx(1.0)


@pytest.mark.parametrize("correction", [None, agl.TIS(cap=2.0)])
def test_an_update_logs_the_mismatch(correction: Any, tmp_path: Any) -> None:
    """A real update (tiny model) reports the mismatch metrics; with a correction, the clipped share
    too, and the ratio is then never taken against the engine's logprobs."""
    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.serving.tokenizer import ByteTokenizer

    from .._helpers import tiny_llama
    from .test_step_pin import fixed_samples

    engine = HFEngine(
        tiny_llama(), tokenizer=ByteTokenizer(), lora=agl.LoRA(r=4, alpha=8), seed=0, model_name="t"
    )
    try:
        trainer = agl.Trainer(
            engine=engine,
            algorithm=agl.GRPO(group_size=4, lr=1e-2),
            store=agl.MemoryStore(),
            output_dir=tmp_path,
            update_config=UpdateConfig(correction=correction),
            logging_config=agl.rl.config.LoggingConfig(loggers=[]),
        )
        stats = trainer.learner.learn(fixed_samples())
        trainer.close()
    finally:
        engine.close()
    assert stats["mismatch/tokens"] == stats["train/response_tokens"]
    assert stats["mismatch/ratio_p5"] <= stats["mismatch/ratio_p50"] <= stats["mismatch/ratio_p95"]
    assert stats["mismatch/kl_k3"] > 0  # the engine logprobs of these samples are made up
    if correction is None:
        assert "mismatch/clipped_frac" not in stats and stats["train/old_logprobs_fallback"] == 1.0
    else:
        assert 0 < stats["mismatch/clipped_frac"] <= 1 and stats["mismatch/masked_frac"] == 0
        assert stats["train/ratio_from_engine_logprobs"] == 0.0
