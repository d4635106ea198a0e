"""Shared fixtures: every store test runs against both store implementations; a stand-in ``vllm``."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.tokenizer import ByteTokenizer

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[agl.Store]:
    """A fresh MemoryStore or SQLiteStore (a real file in tmp_path)."""
    s: agl.Store = agl.MemoryStore() if request.param == "memory" else agl.SQLiteStore(tmp_path / "runs.db")
    yield s
    s.close()


@pytest.fixture
def tracer(store: agl.Store) -> agl.Tracer:
    return agl.Tracer(store)


class _Logprob:
    def __init__(self, logprob: float) -> None:
        self.logprob = logprob


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    calls: list[dict[str, Any]] = []

    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw

    class LoRARequest:
        def __init__(self, lora_name: str, lora_int_id: int, lora_path: str) -> None:
            self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path

    class LLM:
        def __init__(self, model: str, **kw: Any) -> None:
            self.model, self.kw = model, kw
            self.llm_engine = types.SimpleNamespace(
                model_config=types.SimpleNamespace(max_model_len=4096),
                remove_lora=lambda i: calls.append({"rm": i}),
            )

        def get_tokenizer(self) -> Any:
            return ByteTokenizer()

        def generate(self, prompts: Any, params: Any, use_tqdm: bool = True, lora_request: Any = None) -> Any:
            calls.append({"prompts": prompts, "params": params, "lora": lora_request})
            outs = []
            for p in params:
                ids = [104, 105, 257][: p.kw["max_tokens"]]
                lps = [{t: _Logprob(-0.25 * (k + 1)), 1: _Logprob(-9.0)} for k, t in enumerate(ids)]
                comp = types.SimpleNamespace(
                    text="hi", token_ids=ids, logprobs=lps, finish_reason="stop", stop_reason=None
                )
                outs.append(types.SimpleNamespace(outputs=[comp]))
            return outs

    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams  # type: ignore[attr-defined]
    lora_mod = types.ModuleType("vllm.lora")
    req_mod = types.ModuleType("vllm.lora.request")
    req_mod.LoRARequest = LoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora_mod)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", req_mod)
    return types.SimpleNamespace(calls=calls)
