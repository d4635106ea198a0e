"""Shared fixtures: every store test runs against both store implementations; a stand-in ``vllm``;
the tiny Llama (``tiny_llama``) and engines over it (``tiny_engine``), built by ``tests/_helpers.py``."""

from __future__ import annotations

import enum
import sys
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.tokenizer import ByteTokenizer

from . import _budget
from ._helpers import tiny_llama

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def pytest_configure(config: pytest.Config) -> None:
    _budget.pytest_configure(config)  # every test's duration on each run, and the wall-time budget


@pytest.fixture(autouse=True)
def _no_autogen_instrumentation_left_behind() -> Iterator[None]:
    """AutoGen instrumentation is process-wide: one a test left installed (the Calc-X agent installs it
    once per process and keeps it) would record into every later test's rollouts as well."""
    yield
    autogen = sys.modules.get("agentlightning_lite.adapters.autogen")
    if autogen is not None and len(autogen._installed):
        autogen.uninstrument()


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

    class RequestOutputKind(enum.Enum):
        CUMULATIVE = 0
        DELTA = 1
        FINAL_ONLY = 2

    class SamplingParams:
        def __init__(self, **kw: Any) -> None:
            self.kw = kw
            self.output_kind = RequestOutputKind.CUMULATIVE

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

    class AsyncEngineArgs:
        def __init__(self, model: str, **kw: Any) -> None:
            self.model, self.kw = model, kw

    class AsyncLLMEngine:
        """vLLM's async engine API (0.8-0.11): ``generate(prompt, sampling_params, request_id,
        lora_request=...)`` is an async generator of cumulative ``RequestOutput``s, one per engine step;
        ``SamplingParams.output_kind`` (``FINAL_ONLY``: only the last); ``abort(request_id)``;
        ``get_tokenizer()`` (a coroutine); ``remove_lora(id)``; ``shutdown()``.

        Each step takes ``step_s`` seconds of the event loop; requests decode concurrently, as vLLM's
        scheduler interleaves them. ``events`` records (``"start"``/``"token"``/``"finish"``/``"abort"``,
        request_id) in order."""

        step_s = 0.01
        reply = (104, 105, 257)  # "hi" then <|im_end|>, as the sync stand-in

        def __init__(self, args: AsyncEngineArgs) -> None:
            self.args, self.model, self.kw = args, args.model, args.kw
            self.model_config = types.SimpleNamespace(max_model_len=args.kw.get("max_model_len", 4096))
            self.events: list[tuple[str, str]] = []
            self.removed: list[int] = []

        @classmethod
        def from_engine_args(cls, engine_args: AsyncEngineArgs) -> AsyncLLMEngine:
            engine = cls(engine_args)
            state.async_engines.append(engine)
            return engine

        async def get_tokenizer(self, lora_request: Any = None) -> Any:
            return ByteTokenizer()

        async def generate(
            self, prompt: Any, sampling_params: Any, request_id: str, lora_request: Any = None
        ) -> Any:
            import asyncio

            calls.append(
                {"prompt": prompt, "params": sampling_params, "lora": lora_request, "id": request_id}
            )
            self.events.append(("start", request_id))
            kw = sampling_params.kw
            n = kw["max_tokens"]
            # up to 3 tokens: "hi<|im_end|>" cut by max_tokens; more: "hi" then "x"s to max_tokens (no EOS)
            ids = list(self.reply[:n]) if n <= len(self.reply) else [104, 105] + [120] * (n - 2)
            lps: list[dict[int, _Logprob]] = []
            for k, tok in enumerate(ids):
                await asyncio.sleep(self.step_s)
                lps.append({tok: _Logprob(-0.25 * (k + 1)), 1: _Logprob(-9.0)})
                self.events.append(("token", request_id))
                last = k == len(ids) - 1
                finish = ("stop" if tok == 257 else "length") if last else None
                comp = types.SimpleNamespace(
                    text="hi" if k >= 1 else "h",
                    token_ids=list(ids[: k + 1]),
                    logprobs=list(lps),
                    finish_reason=finish,
                    stop_reason=None,
                )
                if last or sampling_params.output_kind is not RequestOutputKind.FINAL_ONLY:
                    yield types.SimpleNamespace(request_id=request_id, outputs=[comp], finished=last)
            self.events.append(("finish", request_id))

        async def abort(self, request_id: str) -> None:
            self.events.append(("abort", request_id))

        async def remove_lora(self, lora_id: int) -> bool:
            self.removed.append(lora_id)
            calls.append({"rm": lora_id})
            return True

        def shutdown(self) -> None:
            state.shutdowns += 1

    state = types.SimpleNamespace(calls=calls, async_engines=[], shutdowns=0, AsyncLLMEngine=AsyncLLMEngine)
    vllm = types.ModuleType("vllm")
    vllm.LLM, vllm.SamplingParams = LLM, SamplingParams  # type: ignore[attr-defined]
    vllm.AsyncLLMEngine, vllm.AsyncEngineArgs = AsyncLLMEngine, AsyncEngineArgs  # type: ignore[attr-defined]
    vllm.sampling_params = types.SimpleNamespace(RequestOutputKind=RequestOutputKind)  # type: ignore[attr-defined]
    lora_mod = types.ModuleType("vllm.lora")
    req_mod = types.ModuleType("vllm.lora.request")
    req_mod.LoRARequest = LoRARequest  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.lora", lora_mod)
    monkeypatch.setitem(sys.modules, "vllm.lora.request", req_mod)
    return state


def tiny_hf_engine(step_delay_s: float = 0.0, no_eos: bool = False, **kw: Any) -> Any:
    """An HFEngine over a one-layer random-init Llama with the byte tokenizer: loads in well under a
    second. ``step_delay_s`` makes every forward pass (one decoding step) that slow; ``no_eos`` keeps
    it from ever ending a reply early, so a request runs to its ``max_tokens``."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from agentlightning_lite.serving.engines import HFEngine

    tok = ByteTokenizer()
    model = tiny_llama(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )

    def hook(module: Any, args: Any, output: Any) -> Any:
        if step_delay_s:
            time.sleep(step_delay_s)
        if no_eos:
            output.logits[..., tok.eos_token_id] = float("-inf")
        return output

    model.register_forward_hook(hook)
    options: dict[str, Any] = {"model_name": "tiny", "seed": 0, "num_threads": 1}
    options.update(kw)
    return HFEngine(model, tokenizer=tok, **options)


@pytest.fixture(name="tiny_llama")
def tiny_llama_fixture() -> Callable[..., Any]:
    """A factory of the seeded two-layer Llama of :func:`tests._helpers.tiny_llama` (keyword
    arguments override its ``LlamaConfig``: ``max_position_embeddings`` is 512 by default)."""
    pytest.importorskip("transformers")
    return tiny_llama


@pytest.fixture(scope="session")
def tiny_smol(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model directory shared by the session: the tiny random-init Llama on SmolLM2's tokenizer and
    chat template, with SmolLM2's 8192-token context (:func:`tests._helpers.tiny_smol_dir`). For tests of
    plumbing (prompts, token ids, spans, rewards, updates) that load a model by name or path where the
    135M model would only add minutes: ``Trainer(model=str(tiny_smol))``, ``--model DIR``."""
    pytest.importorskip("transformers")
    from ._helpers import tiny_smol_dir

    return tiny_smol_dir(tmp_path_factory.mktemp("models") / "tiny-smol", max_position_embeddings=8192)


@pytest.fixture
def tiny_engine() -> Iterator[Any]:
    """A factory of :func:`tiny_hf_engine` engines, closed after the test."""
    made: list[Any] = []

    def make(**kw: Any) -> Any:
        engine = tiny_hf_engine(**kw)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
