"""The vLLM engine's continuous batching through vLLM's async engine API (a stand-in: no GPU here).

The stand-in (``fake_vllm`` in tests/conftest.py) follows ``vllm.AsyncLLMEngine`` as vLLM 0.8-0.11
document it: ``from_engine_args(AsyncEngineArgs(...))``, ``generate(prompt, sampling_params,
request_id, lora_request=...)`` as an async generator of cumulative outputs, ``abort``, ``remove_lora``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.serving.engines import GenRequest


def _adapter(path: Path) -> str:
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text('{"r": 8}')
    return str(path)


def _wait(pred: Any, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.002)


def test_a_request_joins_while_another_is_decoding(fake_vllm: Any, tmp_path: Path) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct", lora=_adapter(tmp_path / "a0"))
    aeng = fake_vllm.async_engines[0]
    assert engine.continuous_batching and engine.llm is None and engine.max_context == 4096
    assert aeng.model == "Qwen/Qwen2.5-0.5B-Instruct" and aeng.kw["enable_lora"] is True
    assert aeng.kw["max_loras"] == 2  # the adapter's old and new version during a hand-over

    long = engine.submit(GenRequest([1, 2], max_tokens=40, request_id="long"))
    # wait until the long request is mid-decode (a few tokens out), then send a short one
    _wait(lambda: sum(1 for e, r in aeng.events if e == "token" and r.startswith("long")) >= 3)
    short = engine.submit(GenRequest([3], max_tokens=3, request_id="short"))
    res_short = short.result(timeout=5)
    assert not long.done(), "the short request finished while the long one was still decoding"
    res_long = long.result(timeout=5)

    order = [(e, r.split("-")[0]) for e, r in aeng.events if e in ("start", "finish")]
    assert order == [("start", "long"), ("start", "short"), ("finish", "short"), ("finish", "long")]
    # exact token ids and logprobs, as vLLM reported them
    assert res_short.token_ids == [104, 105, 257] and res_short.logprobs == [-0.25, -0.5, -0.75]
    assert res_short.finish_reason == "stop" and res_short.weights_version == 0
    assert len(res_long.token_ids) == 40 and res_long.finish_reason == "length"
    assert res_long.logprobs == [-0.25 * (k + 1) for k in range(40)]
    sent = [c for c in fake_vllm.calls if "id" in c]
    assert sent[0]["prompt"] == {"prompt_token_ids": [1, 2]} and sent[0]["lora"].lora_int_id == 1
    assert sent[0]["params"].kw["logprobs"] == 0 and sent[0]["params"].kw["max_tokens"] == 40
    assert sent[0]["params"].output_kind.name == "FINAL_ONLY"  # one output per request, not one per step
    engine.close()
    assert fake_vllm.shutdowns == 1


def test_top_logprobs_and_many_concurrent_requests(fake_vllm: Any) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct")
    t = time.perf_counter()
    results = engine.generate([GenRequest([i], max_tokens=10, top_logprobs=2) for i in range(32)])
    wall = time.perf_counter() - t
    # 32 requests of 10 steps of 10 ms each decode together: about 0.1 s, not 32 x 0.1 s
    assert wall < 1.5, wall
    assert all(r.token_ids == [104, 105] + [120] * 8 for r in results)
    assert results[0].top_logprobs[0] == [(104, -0.25), (1, -9.0)]
    assert engine.stats["requests"] == 32 and engine.stats["generated_tokens"] == 320
    engine.close()


def test_new_weights_serve_new_requests_while_old_ones_finish_on_theirs(
    fake_vllm: Any, tmp_path: Path
) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct", lora=_adapter(tmp_path / "a0"))
    aeng = fake_vllm.async_engines[0]
    old = engine.submit(GenRequest([1], max_tokens=30, request_id="old"))
    _wait(lambda: any(e == "token" for e, _ in aeng.events))
    assert engine.update_weights(_adapter(tmp_path / "a1")) == 1  # no restart
    new = engine.submit(GenRequest([1], max_tokens=2, request_id="new"))
    assert new.result(timeout=5).weights_version == 1
    assert aeng.removed == [], "the old adapter stays while a request still decodes with it"
    assert old.result(timeout=5).weights_version == 0
    _wait(lambda: aeng.removed == [1])  # removed after its last request
    loras = {c["id"].split("-")[0]: c["lora"] for c in fake_vllm.calls if "id" in c}
    assert loras["old"].lora_int_id == 1 and loras["new"].lora_int_id == 2
    assert loras["new"].lora_path.endswith("a1")

    torch = pytest.importorskip("torch")
    assert engine.update_weights({"lora_A.weight": torch.zeros(2, 2)}) == 2  # a state dict, written out
    assert Path(engine.lora_request.lora_path, "adapter_model.safetensors").is_file()
    _wait(lambda: aeng.removed == [1, 2])  # nothing in flight: removed at once
    engine.close()


def test_one_adapter_per_agent_through_the_async_engine(fake_vllm: Any, tmp_path: Path) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine(
        "Qwen/Qwen2.5-0.5B-Instruct",
        adapters={"writer": _adapter(tmp_path / "w0"), "rewriter": _adapter(tmp_path / "r0")},
        routes={"writer": "writer", "rewriter": "rewriter", "checker": None},
    )
    assert fake_vllm.async_engines[0].kw["max_loras"] == 4
    reqs = [GenRequest([1], max_tokens=2, agent=a) for a in ("rewriter", "checker", "writer", None)]
    results = engine.generate(reqs)
    assert [r.adapter for r in results] == ["rewriter", None, "writer", None]
    sent = [c["lora"] for c in fake_vllm.calls if "id" in c]
    paths = sorted(str(lo.lora_path) if lo is not None else "" for lo in sent)
    assert paths == ["", "", str(tmp_path / "r0"), str(tmp_path / "w0")]
    with pytest.raises(KeyError, match="unknown adapter"):
        engine.submit(GenRequest([1], adapter="nope"))
    engine.close()


def test_cancelling_a_request_aborts_it_in_vllm(fake_vllm: Any) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct")
    aeng = fake_vllm.async_engines[0]
    fut = engine.submit(GenRequest([1], max_tokens=500, request_id="gone"))
    _wait(lambda: any(e == "token" for e, _ in aeng.events))
    assert fut.cancel()
    _wait(lambda: any(e == "abort" for e, _ in aeng.events))
    aborted = [r for e, r in aeng.events if e == "abort"]
    assert len(aborted) == 1 and aborted[0].startswith("gone-")
    assert not any(e == "finish" for e, _ in aeng.events)
    engine.close()
    with pytest.raises(RuntimeError, match="closed"):
        engine.submit(GenRequest([1]))


def test_close_aborts_what_is_still_decoding(fake_vllm: Any) -> None:
    from agentlightning_lite.serving.engines import VLLMEngine

    engine = VLLMEngine("Qwen/Qwen2.5-0.5B-Instruct")
    aeng = fake_vllm.async_engines[0]
    fut = engine.submit(GenRequest([1], max_tokens=500))
    _wait(lambda: any(e == "token" for e, _ in aeng.events))
    engine.close()
    assert fut.cancelled() and any(e == "abort" for e, _ in aeng.events)
