"""An agent asks for top_p=0.8 in a training rollout served by the HF engine: the trainer's rescoring
of the first micro-batch, before any update, gives the engine's logprobs (ratio 1), because the call
sampled from the full tempered distribution the trainer scores. (``test_vllm_real.py`` runs the same
probe against a real vLLM.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from benchmarks.perf.bench_ratio_probe import probe

pytest.importorskip("transformers")
pytest.importorskip("starlette")


@pytest.fixture(scope="module")
def hf() -> Iterator[Any]:
    from agentlightning_lite.serving.engines import HFEngine

    engine = HFEngine("smollm2-135m", seed=0, max_batch_size=4)
    yield engine
    engine.close()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_top_p_through_the_hf_engine_gives_ratio_one(hf: Any, temperature: float) -> None:
    m = probe(hf, hf.model, top_p=0.8, prompts=4, tokens=12, temperature=temperature)
    assert m["mismatch/tokens"] > 0
    assert abs(m["mismatch/ratio_mean"] - 1.0) <= 0.02
    assert m["mismatch/ratio_p5"] > 0.98 and m["mismatch/ratio_p95"] < 1.02
