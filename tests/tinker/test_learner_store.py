"""The server trains through the project's Learner (the same adapter weights as the Learner called in
process), moves the engine's weight version on each optim_step, and records every training and
sampling call in its SQLite store, which ``agl-lite runs`` / ``show`` read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.rl.datum import AdamParams
from agentlightning_lite.rl.datum import Datum as LearnerDatum
from agentlightning_lite.rl.engine_setup import update_autocast
from agentlightning_lite.rl.learner import Learner
from agentlightning_lite.rl.policies import Policy, adapter_params
from agentlightning_lite.rl.weights import WeightHandOver
from agentlightning_lite.store.readonly import ReadOnlyStore
from agentlightning_lite.tinker import TinkerServer
from agentlightning_lite.tinker.peft_backend import LORA_ALPHA, lora_targets
from agentlightning_lite.tinker.server import STORE_FILE

from .test_protocol import DATUM, fwd_bwd, optim, sample

SEED = 123
OTHER = {"tokens": [2, 7, 3, 8], "target_tokens": [7, 3, 8, 4], "weights": [0.5, 1.0, 1.0, 2.0]}


def _load_saved(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


def test_training_through_the_server_gives_the_learners_own_weights(api: Any, tiny_smol: Path) -> None:
    from peft import get_peft_model_state_dict

    from agentlightning_lite.serving.engines import HFEngine
    from agentlightning_lite.tinker import Datum

    session = api.session()
    body = {
        "session_id": session,
        "model_seq_id": 0,
        "base_model": api.server.backend.base_model_names()[0],
        "lora_config": {"rank": 4, "seed": SEED},
    }
    model = api.result(api.post("create_model", body).json())["model_id"]
    other = Datum(OTHER["tokens"], {k: OTHER[k] for k in ("target_tokens", "weights")})
    losses = []
    for k, lr in enumerate((0.05, 0.02)):  # two steps: both LoRA matrices move (B starts at 0)
        losses.append(api.result(fwd_bwd(api, model, 2 * k + 1, [DATUM, other]))["metrics"]["loss:sum"])
        api.result(optim(api, model, 2 * k + 2, lr=lr))
    saved = api.result(api.post("save_weights", {"model_id": model, "path": "same", "seq_id": 5}).json())
    served = _load_saved(api.server.registry.directory(saved["path"]))

    # the same calls on a Learner in this process, over a fresh engine of the same model
    engine = HFEngine(str(tiny_smol), num_threads=1, seed=0)
    try:
        torch.manual_seed(SEED)
        # Tinker's LoraConfig defaults (train_attn, train_mlp, train_unembed): the unembedding too
        targets = lora_targets(engine.model)
        engine.add_adapter("mine", agl.LoRA(r=4, alpha=LORA_ALPHA, target_modules=targets), named_only=True)
        params = adapter_params(engine.model, "mine")
        opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0)
        learner = Learner(
            engine.model,
            [Policy("mine", "mine", None, opt, None)],
            WeightHandOver(engine, engine.model),
            agl.SFT(micro_batch_size=8, micro_batch_tokens=4096),
            autocast=update_autocast(engine, params[0].device),  # the engine's precision, as the server
        )
        batch = [
            LearnerDatum(DATUM.tokens, DATUM.inputs),
            LearnerDatum(OTHER["tokens"], {k: OTHER[k] for k in ("target_tokens", "weights")}),
        ]
        mine = []
        for lr in (0.05, 0.02):
            mine.append(learner.forward_backward(batch, "cross_entropy").metrics["loss:sum"])
            learner.optim_step(AdamParams(learning_rate=lr))
        assert engine.version == 2  # each optim_step handed the weights to the engine
        local = {
            k: v.detach().cpu()
            for k, v in get_peft_model_state_dict(
                engine.model, adapter_name="mine", save_embedding_layers=False
            ).items()
        }
    finally:
        engine.close()
    assert losses == pytest.approx(mine, rel=1e-5)
    assert sorted(served) == sorted(local)
    assert any("lm_head.lora_A" in k for k in served) and any("mlp.up_proj.lora_B" in k for k in served)
    assert not any("base_layer" in k for k in served)  # the adapter alone: no copy of the base lm_head
    init = {k for k, v in local.items() if "lora_B" in k and v.abs().sum() > 0}
    assert init, "the B matrices moved"
    for key, value in local.items():
        torch.testing.assert_close(served[key], value, rtol=1e-5, atol=1e-6)


def test_optim_step_moves_the_weight_version_and_samples_say_which(
    api: Any, tinker_server: TinkerServer
) -> None:
    backend = tinker_server.backend
    model = api.model(api.session())
    v0 = backend.weights_version()
    api.result(fwd_bwd(api, model, 1, [DATUM]))
    assert backend.weights_version() == v0  # a forward_backward changes no served weight
    api.result(optim(api, model, 2))
    assert backend.weights_version() == v0 + 1
    snap = api.result(api.post("save_weights_for_sampler", {"model_id": model, "seq_id": 3}).json())
    _, out = sample(api, snap["sampling_session_id"], num_samples=1, params={"max_tokens": 3, "seed": 0})
    assert out["sequences"][0]["tokens"]
    api.result(optim(api, model, 4))
    assert backend.weights_version() == v0 + 3  # the snapshot's load and the second step moved it too


def test_every_call_is_recorded_in_the_sqlite_store(
    api: Any, tinker_server: TinkerServer, capsys: pytest.CaptureFixture[str]
) -> None:
    from agentlightning_lite.cli import main

    path = Path(tinker_server.registry.output_dir) / STORE_FILE
    assert path.is_file()
    session = api.session()
    model = api.model(session, rank=4)
    fb = api.result(fwd_bwd(api, model, 1, [DATUM]))
    step = api.result(optim(api, model, 2, lr=0.01))
    bad = api.result(fwd_bwd(api, model, 3, [DATUM], loss="dro"))
    assert "not served here" in bad["error"]
    snap = api.result(api.post("save_weights_for_sampler", {"model_id": model, "seq_id": 4}).json())
    future, out = sample(api, snap["sampling_session_id"], num_samples=2, params={"max_tokens": 4, "seed": 3})
    finish = {"reason": {"type": "success"}}
    assert api.post(f"sessions/{session}/finish", finish).status_code == 200  # flushes the store

    store = ReadOnlyStore(path)
    try:
        mine = [r for r in store.rollouts() if r.metadata.get("tinker.session_id") == session]
        assert len(mine) == 1 and mine[0].status == "succeeded"
        assert mine[0].task == {
            "tinker_model_id": model,
            "base_model": mine[0].task["base_model"],
            "lora_rank": 4,
        }
        spans = store.spans(mine[0].rollout_id)
        assert [s.name for s in spans] == [
            "forward_backward",
            "optim_step",
            "forward_backward",
            "save_weights_for_sampler",
        ]
        fb_span, step_span, bad_span, _ = spans
        assert fb_span.attributes["metrics"]["loss:sum"] == pytest.approx(fb["metrics"]["loss:sum"])
        assert fb_span.attributes["num_tokens"] == DATUM.length and fb_span.attributes["seq_id"] == 1
        assert step_span.attributes["metrics"]["grad_norm"] == pytest.approx(step["metrics"]["grad_norm"])
        assert step_span.attributes["metrics"]["learning_rate"] == 0.01
        assert step_span.attributes["adam_params"]["learning_rate"] == 0.01
        assert step_span.attributes["weights_version"] == fb_span.attributes["weights_version"] + 1
        assert bad_span.status == "error" and "loss_fn 'dro' is not served here" in (bad_span.error or "")

        ids = future["sample_sequence_ids"]
        sampled = [r for r in store.rollouts() if r.metadata.get("tinker.sample_sequence_ids") == ids]
        assert len(sampled) == 1 and sampled[0].status == "succeeded"
        llm = store.spans(sampled[0].rollout_id)
        assert [s.kind for s in llm] == ["llm", "llm"]
        for s, seq in zip(llm, out["sequences"], strict=True):
            assert s.prompt_token_ids == [1, 5, 9]
            assert s.response_token_ids == seq["tokens"] and len(seq["tokens"]) == 4
            assert s.response_logprobs == pytest.approx(seq["logprobs"])
            assert s.attributes["stop_reason"] == seq["stop_reason"]
            assert s.attributes["weights_version"] == tinker_server.backend.weights_version()
            assert s.attributes["sampling_session_id"] == snap["sampling_session_id"]
    finally:
        store.close()

    # the project's readers see the run
    capsys.readouterr()
    assert main(["runs", str(path), "--json", "--limit", "0"]) == 0
    listed = {r["rollout_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert mine[0].rollout_id in listed and sampled[0].rollout_id in listed
    assert main(["show", str(path), sampled[0].rollout_id, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [s["response_token_ids"] for s in shown["spans"]] == [s["tokens"] for s in out["sequences"]]


def test_a_sample_that_fails_is_recorded_with_its_error(api: Any, tinker_server: TinkerServer) -> None:
    _, out = sample(api, _base_session(api), params={"stop": []})
    assert "stop=[]" in out["error"]
    store = tinker_server.store
    failed = [r for r in store.rollouts(status="failed") if r.metadata.get("tinker.kind") == "sample"]
    assert failed and "stop=[]" in (failed[-1].error or "")
    (span,) = store.spans(failed[-1].rollout_id)
    assert span.status == "error" and span.prompt_token_ids == [1, 5, 9]


def _base_session(api: Any) -> str:
    body = {"session_id": api.session(), "base_model": api.server.backend.base_model_names()[0]}
    return str(api.post("create_sampling_session", body).json()["sampling_session_id"])


def test_the_server_stores_into_a_store_it_is_given(tiny_smol: Path, tmp_path: Path) -> None:
    import httpx

    from agentlightning_lite.tinker import build_backend

    store = agl.MemoryStore()
    backend = build_backend(str(tiny_smol), num_threads=1, seed=0)
    with TinkerServer(backend, tmp_path, store=store, poll_s=0.5) as server:
        base = f"{server.url}/api/v1"
        sid = httpx.post(f"{base}/create_session", json={}).json()["session_id"]
        body = {"session_id": sid, "base_model": backend.base_model_names()[0]}
        sampling = httpx.post(f"{base}/create_sampling_session", json=body).json()["sampling_session_id"]
        req = {
            "sampling_session_id": sampling,
            "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2, 3]}]},
            "sampling_params": {"max_tokens": 2},
        }
        rid = httpx.post(f"{base}/asample", json=req).json()["request_id"]
        while True:
            got = httpx.post(f"{base}/retrieve_future", json={"request_id": rid}, timeout=30).json()
            if got.get("type") != "try_again":
                break
        assert len(got["sequences"][0]["tokens"]) == 2
    assert not (tmp_path / STORE_FILE).exists()
    (ro,) = store.rollouts()
    (span,) = store.spans(ro.rollout_id)
    assert span.response_token_ids == got["sequences"][0]["tokens"]
    assert json.dumps(span.attributes["params"]) == json.dumps({"max_tokens": 2})
