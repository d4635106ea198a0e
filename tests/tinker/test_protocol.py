"""The Tinker API over plain HTTP (no SDK needed): sessions, the future protocol, seq_id order, errors,
protobuf results, training, sampling and checkpoints, against a real server on 127.0.0.1."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentlightning_lite.tinker import Datum, TinkerServer, build_backend
from agentlightning_lite.tinker.server import base_model_names, tokenizer_id
from agentlightning_lite.tinker.wire import decode_message, encode_forward_backward_request

PROTO = {"content-type": "application/x-protobuf"}
DATUM = Datum([1, 5, 9, 13, 17], {"target_tokens": [5, 9, 13, 17, 21], "weights": [0.0, 1.0, 1.0, 1.0, 1.0]})


def fwd_bwd(api: Any, model: str, seq: int, data: list[Datum], loss: str = "cross_entropy", **kw: Any) -> Any:
    body = encode_forward_backward_request(model, seq, data, loss, **kw)
    r = api.http.post("/forward_backward", content=body, headers=PROTO)
    assert r.status_code == 200, r.text
    return r.json()


def optim(api: Any, model: str, seq: int, lr: float = 0.05) -> Any:
    body = {"model_id": model, "seq_id": seq, "adam_params": {"learning_rate": lr}}
    return api.post("optim_step", body).json()


def test_session_routes_answer_what_the_sdk_expects(api: Any) -> None:
    config = api.post("client/config", {"sdk_version": "0.38.0"}).json()
    assert config["parallel_fwdbwd_chunks"] is False and config["pjwt_auth_enabled"] is False
    assert api.post("client/dynamic_config", {}).status_code == 404
    session = api.session()
    assert api.post("session_heartbeat", {"session_id": session}).json() == {"type": "session_heartbeat"}
    assert api.post("telemetry", {"events": []}).json() == {"status": "accepted"}
    assert api.post(f"sessions/{session}/finish", {"reason": {"type": "success"}}).status_code == 200
    bad = api.post("session_heartbeat", {"session_id": "nope"})
    assert bad.status_code == 404 and "unknown session_id 'nope'" in bad.json()["error"]


def test_create_model_names_the_served_models_when_the_base_model_is_wrong(api: Any) -> None:
    body = {"session_id": api.session(), "model_seq_id": 0, "base_model": "Qwen/Qwen3-8B"}
    r = api.post("create_model", body)
    assert r.status_code == 422
    assert r.json()["category"] == "user"
    assert "'Qwen/Qwen3-8B' is not served here" in r.json()["error"]
    assert api.server.backend.base_model_names()[0] in r.json()["error"]


def test_get_info_names_a_tokenizer_directory_that_loads_offline(api: Any) -> None:
    model = api.model(api.session(), rank=8)
    info = api.post("get_info", {"model_id": model}).json()
    assert info["model_id"] == model and info["lora_rank"] == 8 and info["is_lora"] is True
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(info["model_data"]["tokenizer_id"])
    assert tok.decode(tok.encode("hello")) == "hello"


def test_base_model_names_end_with_the_tokenizer_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentlightning_lite import models

    converted = tmp_path / "smollm2-135m" / "safetensors"
    monkeypatch.setattr(models, "safetensors_dir", lambda name: converted)
    names = base_model_names("smollm2-135m")
    assert names == ["HuggingFaceTB/SmolLM2-135M-Instruct", "smollm2-135m", str(converted)]
    assert names[-1] == tokenizer_id("smollm2-135m")
    (tmp_path / "local-model").mkdir()
    monkeypatch.chdir(tmp_path)
    assert base_model_names("local-model") == ["local-model", str(tmp_path.resolve() / "local-model")]
    assert base_model_names("org/not-a-directory") == ["org/not-a-directory"]


def test_create_model_accepts_the_tokenizer_directory_get_info_names(
    tiny_smol: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a recipe that loads its tokenizer from a local directory (tinker-cookbook's `model_name=DIR`) names
    # the base model by that directory too: a server started on a relative path accepts the absolute one
    import httpx

    monkeypatch.chdir(tiny_smol.parent)
    server = TinkerServer(build_backend(tiny_smol.name, num_threads=1), tmp_path, poll_s=0.5).start()
    http = httpx.Client(base_url=f"{server.url}/api/v1", timeout=60)

    def create(session: str, seq: int, base_model: str) -> dict[str, Any]:
        body = {
            "session_id": session,
            "model_seq_id": seq,
            "base_model": base_model,
            "lora_config": {"rank": 4},
        }
        future = http.post("/create_model", json=body).json()
        for _ in range(120):
            out = http.post("/retrieve_future", json={"request_id": future["request_id"]}).json()
            if out.get("type") != "try_again":
                return dict(out)
        raise AssertionError(f"create_model({base_model!r}) did not finish")

    try:
        session = http.post("/create_session", json={}).json()["session_id"]
        first = create(session, 0, tiny_smol.name)["model_id"]  # by the name it was started with
        directory = http.post("/get_info", json={"model_id": first}).json()["model_data"]["tokenizer_id"]
        assert directory == str(tiny_smol.resolve())
        second = create(session, 1, directory)
        assert second == {"type": "create_model", "model_id": f"{session}:train:1"}
        info = http.post("/get_info", json={"model_id": second["model_id"]}).json()
        assert info["model_data"]["model_name"] == tiny_smol.name  # the first name is the one reported
        caps = http.get("/get_server_capabilities").json()["supported_models"]
        assert [m["model_name"] for m in caps] == [tiny_smol.name, directory]
    finally:
        http.close()
        server.close()


def test_ops_run_in_seq_id_order_and_poll_answers_try_again_meanwhile(api: Any) -> None:
    model = api.model(api.session())
    step = optim(api, model, 2)  # arrives before the forward_backward it must follow
    waiting = api.post("retrieve_future", {"request_id": step["request_id"]}).json()
    assert waiting == {"type": "try_again", "request_id": step["request_id"], "queue_state": "active"}
    assert api.server.api.queue.waiting(model) == [2]
    assert optim(api, model, 2)["request_id"] == step["request_id"]  # a retried submission: same future
    fb = fwd_bwd(api, model, 1, [DATUM])
    assert api.result(fb)["metrics"]["loss:sum"] > 0
    assert api.result(step)["metrics"]["grad_norm"] > 0  # it ran after the gradient was there
    assert fwd_bwd(api, model, 1, [DATUM])["request_id"] == fb["request_id"]  # retried: the same body
    late = api.post("optim_step", {"model_id": model, "seq_id": 1, "adam_params": {"learning_rate": 0.05}})
    assert late.status_code == 422 and "already submitted with a different request" in late.json()["error"]
    back = fwd_bwd(api, model, 3, [DATUM])
    api.result(back)
    again = api.post("optim_step", {"model_id": model, "seq_id": 0, "adam_params": {}})
    assert again.status_code == 422 and "seq_id must be an integer >= 1" in again.json()["error"]


def test_a_failed_op_resolves_to_an_error_that_names_the_cause(api: Any) -> None:
    model = api.model(api.session())
    out = api.result(fwd_bwd(api, model, 1, [DATUM], loss="dro"))
    assert out["category"] == "user" and "loss_fn 'dro' is not served here" in out["error"]
    no_weights = Datum(DATUM.tokens, {"target_tokens": DATUM.inputs["target_tokens"]})
    out = api.result(fwd_bwd(api, model, 2, [no_weights]))
    assert "data[0] has no loss_fn_inputs['weights'], which cross_entropy needs" in out["error"]
    short = Datum(DATUM.tokens, {"target_tokens": [1, 2], "weights": [1.0, 1.0]})
    assert "has 2 values for 5 input tokens" in api.result(fwd_bwd(api, model, 3, [short]))["error"]
    unknown = api.post("retrieve_future", {"request_id": "req-999999"})
    assert unknown.status_code == 404 and "unknown request_id 'req-999999'" in unknown.json()["error"]
    not_proto = api.post("forward_backward", {"model_id": model, "seq_id": 4})
    assert not_proto.status_code == 422 and "protobuf body" in not_proto.json()["error"]


def test_cross_entropy_goes_down_and_results_come_as_protobuf_when_asked(api: Any) -> None:
    model = api.model(api.session())
    losses = []
    for k in range(5):
        fb = fwd_bwd(api, model, 2 * k + 1, [DATUM])
        optim(api, model, 2 * k + 2, lr=1e-3)
        if k == 0:  # the SDK asks for protobuf
            raw = api.result(fb, headers={"accept": "application/x-protobuf"})
            assert raw.headers["content-type"] == "application/x-protobuf"
            out = decode_message("ForwardBackwardOutput", raw.content)
            field = next(f.value for f in out.loss_fn_outputs[0].fields if f.key == "logprobs")
            logprobs = np.frombuffer(field.data, dtype=np.float32)
            assert len(logprobs) == 5 and np.frombuffer(field.offsets, dtype=np.int64).tolist() == [0, 20]
            metrics = {m.key: m.value for m in out.metrics}
            # sum-reduced: loss:sum is -sum(w * lp) over the tokens
            assert metrics["loss:sum"] == pytest.approx(-float(logprobs[1:].sum()), rel=1e-5)
            losses.append(metrics["loss:sum"])
        else:
            losses.append(api.result(fb)["metrics"]["loss:sum"])
    assert all(b < a for a, b in itertools.pairwise(losses)) and losses[-1] < losses[0] - 0.5, losses


def test_importance_sampling_is_the_summed_ratio_times_advantage(api: Any) -> None:
    model = api.model(api.session())
    first = api.result(fwd_bwd(api, model, 1, [DATUM], forward_only=True))
    lp = first["loss_fn_outputs"][0]["logprobs"]["data"]
    old, adv = [x - 0.1 for x in lp], [0.0, 1.0, -0.5, 2.0, 1.0]
    datum = Datum(
        DATUM.tokens, {"target_tokens": DATUM.inputs["target_tokens"], "logprobs": old, "advantages": adv}
    )
    out = api.result(fwd_bwd(api, model, 2, [datum], loss="importance_sampling"))
    expected = -sum(math.exp(a - b) * c for a, b, c in zip(lp, old, adv, strict=True))
    assert out["metrics"]["loss:sum"] == pytest.approx(expected, rel=1e-4)


def sample(api: Any, session: str, **kw: Any) -> Any:
    body = {
        "sampling_session_id": session,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 5, 9]}]},
        "num_samples": kw.pop("num_samples", 1),
        "sampling_params": kw.pop("params", {}),
        **kw,
    }
    future = api.post("asample", body).json()
    return future, api.result(future)


def test_sampling_from_a_snapshot_honours_the_sampling_params(api: Any) -> None:
    model = api.model(api.session())
    snap = api.result(api.post("save_weights_for_sampler", {"model_id": model, "seq_id": 1}).json())
    session = snap["sampling_session_id"]
    future, out = sample(api, session, num_samples=3, params={"max_tokens": 6, "seed": 7})
    assert len(future["sample_sequence_ids"]) == 3
    seqs = out["sequences"]
    assert [len(s["tokens"]) for s in seqs] == [6, 6, 6] and {s["stop_reason"] for s in seqs} == {"length"}
    assert all(len(s["logprobs"]) == 6 for s in seqs) and seqs[0]["tokens"] != seqs[1]["tokens"]
    # a stop string ends the sample; its tokens are returned with it
    _, stopped = sample(api, session, params={"max_tokens": 40, "seed": 1, "stop": ["e"]})
    seq = stopped["sequences"][0]
    text = api.server.backend.engine.decode(seq["tokens"])
    assert seq["stop_reason"] == "stop" and "e" in text
    assert "e" not in api.server.backend.engine.decode(seq["tokens"][:-1])
    # compute_logprobs: one new token, the prompt's logprobs (None for the first)
    _, scored = sample(api, session, params={"max_tokens": 1}, prompt_logprobs=True)
    assert scored["prompt_logprobs"][0] is None and all(x < 0 for x in scored["prompt_logprobs"][1:])
    _, refused = sample(api, session, params={"stop": []})
    assert "stop=[] (no stopping" in refused["error"]


def test_save_and_load_weights_through_tinker_paths(api: Any, tinker_server: TinkerServer) -> None:
    session = api.session()
    model = api.model(session, rank=4)
    api.result(fwd_bwd(api, model, 1, [DATUM]))
    api.result(optim(api, model, 2))
    saved = api.result(api.post("save_weights", {"model_id": model, "path": "step-1", "seq_id": 3}).json())
    assert saved == {"type": "save_weights", "path": f"tinker://{model}/weights/step-1"}
    assert (tinker_server.registry.directory(saved["path"]) / "adapter_model.safetensors").is_file()
    before = api.result(fwd_bwd(api, model, 4, [DATUM], forward_only=True))
    body = {"session_id": session, "model_seq_id": 1, "path": saved["path"], "optimizer": True}
    loaded = api.post("load_weights", body).json()
    assert loaded["model_id"] == f"{session}:train:1"
    assert api.result(loaded)["model_id"] == loaded["model_id"]
    assert api.post("get_info", {"model_id": loaded["model_id"]}).json()["lora_rank"] == 4
    after = api.result(fwd_bwd(api, loaded["model_id"], 1, [DATUM], forward_only=True))
    assert after["loss_fn_outputs"] == before["loss_fn_outputs"]
    missing = api.post("load_weights", {**body, "model_seq_id": 2, "path": f"tinker://{model}/weights/nope"})
    assert missing.status_code == 404 and "no checkpoint at" in missing.json()["error"]


def test_an_api_key_is_required_when_set(tinker_server: TinkerServer) -> None:
    import httpx

    tinker_server.api_key = "tml-secret"
    try:
        base = f"{tinker_server.url}/api/v1"
        r = httpx.post(f"{base}/create_session", json={})
        assert r.status_code == 401 and "no API key given" in r.json()["error"]
        assert (
            httpx.post(f"{base}/create_session", json={}, headers={"X-API-Key": "tml-other"}).status_code
            == 401
        )
        ok = httpx.post(f"{base}/create_session", json={}, headers={"X-API-Key": "tml-secret"})
        assert ok.status_code == 200 and ok.json()["session_id"]
    finally:
        tinker_server.api_key = None


def test_lora_config_flags_choose_the_adapted_modules(api: Any, tinker_server: TinkerServer) -> None:
    """train_attn / train_mlp / train_unembed decide where the LoRA goes (Tinker's defaults: all
    three); the flags are kept with saved weights, reported by weights_info, and a load rebuilds the
    same adapter; none of the three is refused."""
    session = api.session()
    base = tinker_server.backend.base_model_names()[0]

    def create(seq: int, **flags: bool) -> dict[str, Any]:
        body = {
            "session_id": session,
            "model_seq_id": seq,
            "base_model": base,
            "lora_config": {"rank": 2, **flags},
        }
        return dict(api.result(api.post("create_model", body).json()))

    def saved_keys(model: str, name: str) -> tuple[set[str], str]:
        out = api.result(api.post("save_weights", {"model_id": model, "path": name, "seq_id": 1}).json())
        from safetensors.torch import load_file

        keys = set(
            load_file(str(tinker_server.registry.directory(out["path"]) / "adapter_model.safetensors"))
        )
        return {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in keys}, out["path"]

    default = create(0)["model_id"]
    modules, _ = saved_keys(default, "all")
    assert modules == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
    attn_only = create(1, train_mlp=False, train_unembed=False)["model_id"]
    modules, path = saved_keys(attn_only, "attn")
    assert modules == {"q_proj", "k_proj", "v_proj", "o_proj"}
    info = api.post("weights_info", {"tinker_path": path}).json()
    assert info | {"base_model": None} == {
        "base_model": None, "is_lora": True, "lora_rank": 2,
        "train_attn": True, "train_mlp": False, "train_unembed": False,
    }  # fmt: skip
    loaded = api.post("load_weights", {"session_id": session, "model_seq_id": 2, "path": path}).json()
    assert api.result(loaded)["model_id"] == loaded["model_id"]
    run = api.http.get(f"/training_runs/{loaded['model_id']}").json()
    assert (run["train_attn"], run["train_mlp"], run["train_unembed"]) == (True, False, False)
    # a checkpoint with other modules does not load into an existing model
    body = {"model_id": default, "path": path, "seq_id": 2}
    refused = api.result(api.post("load_weights", body).json())
    assert "train_attn/train_mlp/train_unembed=[True, False, False]" in refused["error"]
    none = create(3, train_attn=False, train_mlp=False, train_unembed=False)
    assert "at least one of train_attn, train_mlp and train_unembed" in none["error"]
    bad = create(4, train_mlp="yes")
    assert "lora_config.train_mlp must be true or false" in bad["error"]
