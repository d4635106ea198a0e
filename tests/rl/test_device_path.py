"""Two real GRPO steps through the HF engine and the trainer on each device: CPU (float32) and CUDA (bf16);
QLoRA's errors where it cannot run, and QLoRA training where it can.

The same test runs on both: the CPU case in every test run, the CUDA case (marked ``gpu``) only where
torch sees a GPU. A tiny random-init Llama and the byte tokenizer: no download, seconds on a CPU.
The agent speaks HTTP with the standard library, so the test needs no ``openai`` client.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.models import ResolvedModel
from agentlightning_lite.rl._runtime import is_checkpointing as _is_checkpointing
from agentlightning_lite.rl.batching import Sample, collate, forward_logprobs
from agentlightning_lite.rl.config import LoggingConfig, UpdateConfig
from agentlightning_lite.serving.engines import GenRequest, HFEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from .._helpers import tiny_llama as shared_tiny_llama

CUDA = torch.cuda.is_available()

# Tolerances on the mean absolute difference per token between the engine's logprobs (incremental
# decoding with a KV cache) and a recomputation (one forward pass over prompt + response).
# float32: both are the same fp32 arithmetic up to summation order: ~1e-6 in practice; 1e-4 leaves room.
# bf16: 8 significant bits (unit roundoff 2**-9 ~= 0.002). Logits of magnitude O(1..10) come out of
# bf16 matmuls with absolute errors of ~0.01-0.04, and a KV-cache decode and a full-sequence forward use
# different matmul shapes (so different kernels and summation orders): per-token logprob differences of
# a few 1e-2 are expected. 0.05 on the mean is well above that noise and far below what a real bug
# gives (a wrong position id, adapter or temperature shifts logprobs by O(1)).
TOLERANCE = {"cpu": 1e-4, "cuda": 5e-2, "cpu-bf16": 5e-2}


def tiny_llama() -> Any:
    """The shared tiny Llama (tests/_helpers.py), twice as wide as its default."""
    return shared_tiny_llama(hidden_size=64, intermediate_size=128)


def chat(llm: agl.LLM, content: str) -> str:
    """One chat completion over HTTP with urllib (the OpenAI wire format)."""
    body = {
        "model": llm.model,
        "max_tokens": 8,
        "temperature": 1.0,
        "messages": [{"role": "user", "content": content}],
    }
    req = urllib.request.Request(
        llm.base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {llm.api_key}"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)["choices"][0]["message"]["content"] or ""


def varied(task: dict, llm: agl.LLM) -> float:
    """Rewards replies with more distinct characters: a spread in every group, so GRPO has a gradient."""
    return len(set(chat(llm, task["q"]))) / 8.0


LORA = agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])


def tiny_engine(device: str, **kw: Any) -> HFEngine:
    return HFEngine(
        tiny_llama(), tokenizer=ByteTokenizer(), lora=LORA, device=device, seed=0, model_name="tiny", **kw
    )


def run_two_steps(engine: HFEngine, tmp_path: Path, gradient_checkpointing: bool) -> agl.Trainer:
    """Two GRPO steps; checks devices, dtypes, that every LoRA matrix moved and the logprobs agree."""
    device = engine.device.type
    kind = "cpu-bf16" if device == "cpu" and engine.autocast_dtype == torch.bfloat16 else device
    trainer = agl.Trainer(
        engine=engine,
        algorithm=agl.GRPO(group_size=4, lr=1e-2, micro_batch_size=4),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
        # old logprobs recomputed for every micro-batch: the mismatch covers every sample
        update_config=UpdateConfig(old_logprobs="recompute", gradient_checkpointing=gradient_checkpointing),
    )
    try:
        # everything on the requested device; bf16 weights and autocast on a bf16 GPU, float32 on a CPU
        assert trainer.device.type == device and engine.device.type == device
        assert all(p.device.type == device for p in trainer.policy.parameters())
        if device == "cuda" and torch.cuda.is_bf16_supported():
            assert engine.dtype == torch.bfloat16 and trainer.autocast == torch.bfloat16
        if kind == "cpu":
            assert engine.dtype == torch.float32 and trainer.autocast is None
        if kind == "cpu-bf16":  # float32 weights, bf16 compute in generation and update alike
            assert engine.dtype == torch.float32 and trainer.autocast == torch.bfloat16
        assert _is_checkpointing(trainer.policy) == gradient_checkpointing

        before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
        assert before and all("lora_" in n for n in before)
        tasks = [{"q": f"Tell me about {i}."} for i in range(4)]
        trainer.fit(varied, tasks, steps=2)
        rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]
        for r in rows:
            assert r.get("train/skipped_update", 0.0) == 0.0
            assert math.isfinite(r["train/loss"]) and math.isfinite(r["train/grad_norm"])
            # the trainer compared the engine's logprobs with its own forward pass on every sample
            assert r["train/logprob_mismatch_mean"] <= TOLERANCE[kind], r["train/logprob_mismatch_mean"]

        after = {n: p.detach() for n, p in trainer.policy.named_parameters() if p.requires_grad}
        changed = [n for n in before if not torch.equal(before[n], after[n])]
        assert len(changed) == len(before), "every LoRA matrix must move in two steps"
        assert engine.version == 2

        # the updated adapter is what the engine serves: its logprobs match a recomputation
        prompt = engine.encode(engine.apply_chat_template([{"role": "user", "content": "Hello there"}]))
        res = engine.generate([GenRequest(prompt, max_tokens=12, temperature=1.0)])[0]
        assert len(res.logprobs) == len(res.token_ids) > 0
        batch = collate([Sample(prompt, res.token_ids, None, 0.0, None)], engine.pad_token_id).to(
            trainer.device
        )
        with torch.no_grad():
            lp, _ = forward_logprobs(trainer.policy, batch, None, trainer.autocast)
        diff = (lp[0].float().cpu() - torch.tensor(res.logprobs)).abs()
        assert float(diff.mean()) <= TOLERANCE[kind], diff
    finally:
        trainer.close()
        engine.close()
    return trainer


@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_two_steps_on_cpu_in_float32(tmp_path: Path, gradient_checkpointing: bool) -> None:
    run_two_steps(tiny_engine("cpu"), tmp_path, gradient_checkpointing)


def test_two_steps_on_cpu_under_bf16_autocast(tmp_path: Path) -> None:
    """``HFEngine(autocast="bfloat16")``: float32 weights, bf16 compute; the trainer follows the engine."""
    engine = tiny_engine("cpu", autocast="bfloat16")
    ref = tiny_engine("cpu")
    prompt = ref.encode(ref.apply_chat_template([{"role": "user", "content": "Hi"}]))
    greedy = [GenRequest(prompt, max_tokens=6, temperature=0.0)]
    a, b = engine.generate(greedy)[0], ref.generate(greedy)[0]
    # the same model in two precisions: close logprobs, not bit-identical ones
    assert a.token_ids[0] == b.token_ids[0]
    assert 0 < abs(a.logprobs[0] - b.logprobs[0]) < 5e-2
    ref.close()
    run_two_steps(engine, tmp_path, gradient_checkpointing=False)


def test_autocast_values_are_checked() -> None:
    with pytest.raises(ValueError, match="autocast must be"):
        tiny_engine("cpu", autocast="int8")
    with pytest.raises(ValueError, match="on a CPU use 'bfloat16'"):
        tiny_engine("cpu", autocast="float16")
    engine = tiny_engine("cpu", autocast=None)
    assert engine.autocast_dtype is None
    engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("gradient_checkpointing", [False, True])
def test_two_steps_on_cuda_in_bf16(tmp_path: Path, gradient_checkpointing: bool) -> None:
    torch.cuda.reset_peak_memory_stats()
    run_two_steps(tiny_engine("cuda"), tmp_path, gradient_checkpointing)
    assert torch.cuda.max_memory_allocated() > 0


# -- QLoRA -----------------------------------------------------------------------------------------
QLORA = agl.LoRA(r=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], load_in_4bit=True)
HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_without_cuda_the_error_says_qlora_needs_a_gpu() -> None:
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU .*LoRA\(load_in_4bit=False\)"):
        HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=QLORA, dtype="float32")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        agl.Trainer(
            engine="hf", lora=QLORA, store=agl.MemoryStore(), logging_config=LoggingConfig(loggers=[])
        )


def test_without_bitsandbytes_the_error_names_the_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    with pytest.raises(RuntimeError, match=r"needs bitsandbytes: pip install bitsandbytes"):
        HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=QLORA, device="cuda", dtype="float32")


def test_qlora_on_a_cpu_device_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(RuntimeError, match="on a CUDA device, got device='cpu'"):
        HFEngine(tiny_llama(), tokenizer=ByteTokenizer(), lora=QLORA, device="cpu", dtype="float32")


def test_a_gguf_model_cannot_be_quantised_to_4bit() -> None:
    gguf = ResolvedModel("smollm2-135m", "/x", "m.gguf", hf_id="HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(
        ValueError, match="Pass the Hugging Face id \\(HuggingFaceTB/SmolLM2-135M-Instruct\\)"
    ):
        HFEngine._4bit_kwargs(object(), gguf)  # type: ignore[arg-type]


@pytest.mark.gpu
@pytest.mark.skipif(not (torch.cuda.is_available() and HAS_BNB), reason="needs a CUDA GPU and bitsandbytes")
def test_qlora_trains_on_a_gpu(tmp_path: Path) -> None:
    model_dir = tmp_path / "tiny"
    tiny_llama().save_pretrained(model_dir)  # safetensors: what bitsandbytes quantises on load
    engine = HFEngine(str(model_dir), tokenizer=ByteTokenizer(), lora=QLORA, seed=0, model_name="tiny")
    assert engine.load_in_4bit and engine.device.type == "cuda"
    import bitsandbytes as bnb

    base = engine.model.get_base_model()
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in base.modules()), "the base must be 4-bit"
    run_two_steps(engine, tmp_path / "run", gradient_checkpointing=True)
