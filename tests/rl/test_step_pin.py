"""A pinned update: the same samples, seed and settings give the adapter (and metrics) recorded in
``data/step_pin.json`` within 1e-6, so a refactor of the training step cannot change its numbers.

Regenerate only when a change of the numbers is intended: ``AGL_PIN_WRITE=1 pytest <this file>``.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.batching import Sample
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import tiny_llama

PIN = Path(__file__).parent / "data" / "step_pin.json"
CASES: dict[str, Any] = {
    "grpo": lambda: agl.GRPO(group_size=4, lr=1e-2, epochs=2, micro_batch_size=3),
    "grpo-kl": lambda: agl.GRPO(group_size=4, lr=1e-2, kl_coef=0.1, loss_agg="seq-mean-token-mean"),
    "ppo": lambda: agl.PPO(lr=1e-2, epochs=2, gamma=0.9, lam=0.8),
}
KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "train/response_tokens")


def fixed_samples() -> list[Sample]:
    """Two tasks x four rollouts of one call each: fixed tokens, engine logprobs and rewards."""
    rng = random.Random(7)
    out = []
    for task in range(2):
        prompt = [rng.randrange(0, 256) for _ in range(rng.randint(4, 8))]
        for k in range(4):
            response = [rng.randrange(0, 256) for _ in range(rng.randint(2, 6))]
            out.append(
                Sample(
                    list(prompt),
                    response,
                    [-rng.uniform(3.0, 7.0) for _ in response],
                    reward=float(rng.random() < 0.5) + 0.1 * k,
                    group=(task, "default"),
                    rollout_id=f"r{task}-{k}",
                    meta={"policy": "default"},
                )
            )
    return out


def run_case(name: str, tmp_path: Path) -> tuple[dict[str, list[float]], dict[str, float]]:
    from agentlightning_lite.serving.engines import HFEngine

    engine = HFEngine(
        tiny_llama(),
        tokenizer=ByteTokenizer(),
        lora=agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]),
        seed=0,
        model_name="tiny",
    )
    try:
        with torch.no_grad():  # a non-zero adapter, so the LoRA A matrices get a gradient too
            gen = torch.Generator().manual_seed(3)
            for n, p in engine.model.named_parameters():
                if "lora_B" in n:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        trainer = agl.Trainer(
            engine=engine,
            algorithm=CASES[name](),
            store=agl.MemoryStore(),
            output_dir=tmp_path,
            logging_config=LoggingConfig(loggers=[]),
        )
        stats = learn(trainer, fixed_samples())
        adapter = {
            n: [float(x) for x in p.detach().flatten()]
            for n, p in trainer.policy.named_parameters()
            if "lora_" in n
        }
        if trainer.value_head is not None:
            adapter.update(
                {
                    f"value_head.{n}": [float(x) for x in p.detach().flatten()]
                    for n, p in trainer.value_head.named_parameters()
                }
            )
        trainer.close()
    finally:
        engine.close()
    return adapter, {k: float(stats[k]) for k in KEYS}


def learn(trainer: agl.Trainer, samples: list[Sample]) -> dict[str, float]:
    return trainer.learner.learn(samples)


@pytest.mark.parametrize("name", list(CASES))
def test_an_update_gives_the_pinned_adapter(name: str, tmp_path: Path) -> None:
    adapter, stats = run_case(name, tmp_path)
    if os.environ.get("AGL_PIN_WRITE"):
        pins = json.loads(PIN.read_text()) if PIN.exists() else {}
        pins[name] = {"stats": stats, "adapter": adapter}
        PIN.write_text(json.dumps(pins, indent=None, sort_keys=True))
    pinned = json.loads(PIN.read_text())[name]
    assert set(adapter) == set(pinned["adapter"]) and adapter
    for n, values in adapter.items():
        torch.testing.assert_close(
            torch.tensor(values), torch.tensor(pinned["adapter"][n]), rtol=0, atol=1e-6, msg=n
        )
    assert stats == pytest.approx(pinned["stats"], rel=1e-5, abs=1e-6)
