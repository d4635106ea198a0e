"""Bad input gets its own clear error and loses nothing: malformed protobuf, wrong tensor shapes,
unknown ids and paths, a client that goes away mid-request or mid-sequence, two clients racing on one
model; after each, the server keeps training and sampling for the others."""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx
import pytest

from agentlightning_lite.tinker import Datum, TinkerServer
from agentlightning_lite.tinker.routes import MAX_BODY_BYTES
from agentlightning_lite.tinker.wire import decode_message, encode_forward_backward_request

from .test_protocol import DATUM, PROTO, fwd_bwd, optim, sample


def _refused(resp: httpx.Response, status: int, words: str) -> None:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error", "category"} and body["category"] == "user", body
    assert words in body["error"], body["error"]
    assert "Traceback" not in resp.text


def _alive(api: Any) -> None:
    """The server still trains a fresh model and samples from it."""
    assert api.http.get("/healthz").json() == {"status": "ok"}
    model = api.model(api.session())
    assert api.result(fwd_bwd(api, model, 1, [DATUM]))["metrics"]["loss:sum"] > 0
    assert api.result(optim(api, model, 2))["metrics"]["grad_norm"] > 0
    snap = api.result(api.post("save_weights_for_sampler", {"model_id": model, "seq_id": 3}).json())
    _, out = sample(api, snap["sampling_session_id"], params={"max_tokens": 2})
    assert len(out["sequences"][0]["tokens"]) == 2


def _post_proto(api: Any, raw: bytes, **headers: str) -> httpx.Response:
    return api.http.post("/forward_backward", content=raw, headers={**PROTO, **headers})


def test_malformed_protobuf_bodies_are_refused_with_the_cause(api: Any) -> None:
    model = api.model(api.session())
    _refused(
        _post_proto(api, b"\xff\xff\xff\xff not a message"), 422, "not a protobuf ForwardBackwardRequest"
    )
    _refused(_post_proto(api, b"\x28\x01", **{"content-encoding": "zstd"}), 422, "not valid zstd")
    good = encode_forward_backward_request(model, 1, [DATUM], "cross_entropy")
    _refused(_post_proto(api, good[:-3]), 422, "not a protobuf ForwardBackwardRequest")  # cut short

    msg = decode_message("ForwardBackwardRequest", good)
    msg.data[0].model_input[0].encoded_text.tokens += b"\x01"  # 21 bytes: not whole int32 ids
    _refused(_post_proto(api, msg.SerializeToString()), 422, "not a whole number of int32 token ids")
    _alive(api)


def _with_tensor(model: str, name: str, change: Any) -> bytes:
    msg = decode_message(
        "ForwardBackwardRequest", encode_forward_backward_request(model, 1, [DATUM], "cross_entropy")
    )
    entry = next(e for e in msg.data[0].loss_fn_inputs if e.key == name)
    change(entry.value)
    return bytes(msg.SerializeToString())


def test_wrong_tensor_shapes_and_values_are_refused(api: Any) -> None:
    import numpy as np

    model = api.model(api.session())

    def claim_seven(t: Any) -> None:
        t.shape[0] = 7

    def two_d(t: Any) -> None:
        t.shape[:] = [1, 5]

    def odd_bytes(t: Any) -> None:
        t.dense = t.dense[:-1]

    def fractional_ids(t: Any) -> None:
        t.dense, t.dtype = np.asarray([5, 9.5, 13, 17, 21], dtype=np.float32).tobytes(), 1  # float32

    _refused(
        _post_proto(api, _with_tensor(model, "weights", claim_seven)), 422, "has shape [7] but holds 5 values"
    )
    _refused(_post_proto(api, _with_tensor(model, "weights", two_d)), 422, "1-D loss inputs only")
    _refused(_post_proto(api, _with_tensor(model, "target_tokens", odd_bytes)), 422, "not a whole number")
    _refused(_post_proto(api, _with_tensor(model, "target_tokens", fractional_ids)), 422, "whole token ids")
    # a length that disagrees with the model input, and values the loss cannot use: errors of the operation
    short = Datum(DATUM.tokens, {"target_tokens": DATUM.inputs["target_tokens"], "weights": [1.0, 1.0]})
    out = api.result(fwd_bwd(api, model, 1, [short]))
    assert out["category"] == "user" and "has 2 values for 5 input tokens" in out["error"]
    nan = Datum(DATUM.tokens, {"target_tokens": DATUM.inputs["target_tokens"], "weights": [float("nan")] * 5})
    out = api.result(fwd_bwd(api, model, 2, [nan]))
    assert out["category"] == "user" and "non-finite loss" in out["error"]
    huge = Datum(DATUM.tokens, {"target_tokens": [5, 9, 13, 17, 10**9], "weights": [1.0] * 5})
    out = api.result(fwd_bwd(api, model, 3, [huge]))
    assert "token ids outside the vocabulary" in out["error"]
    # the model is untouched by the refused ones: it still trains from its next seq_id
    assert api.result(fwd_bwd(api, model, 4, [DATUM]))["metrics"]["loss:sum"] > 0
    _alive(api)


def test_unknown_ids_and_paths_are_named(api: Any) -> None:
    session = api.session()
    model = api.model(session)
    _refused(
        api.post("optim_step", {"model_id": "nope:train:0", "seq_id": 1}),
        404,
        "unknown model_id 'nope:train:0'",
    )
    raw = encode_forward_backward_request("ghost", 1, [DATUM], "cross_entropy")
    _refused(_post_proto(api, raw), 404, "unknown model_id 'ghost'")
    _refused(api.post("get_info", {"model_id": 7}), 404, "unknown model_id 7")
    body = {"session_id": session, "model_seq_id": 5, "path": f"tinker://{model}/weights/never-saved"}
    _refused(api.post("load_weights", body), 404, "no checkpoint at tinker://")
    body["path"] = "tinker://../../etc/passwd"
    _refused(api.post("load_weights", body), 422, "is not tinker://<model_id>/weights/<name>")
    _refused(api.post("weights_info", {"tinker_path": "s3://bucket/x"}), 422, "starts with tinker://")
    _refused(api.post("asample", {"sampling_session_id": "sampler-999"}), 404, "unknown sampling_session_id")
    _refused(
        api.post("create_sampling_session", {"session_id": session, "model_path": "tinker://x/weights/y"}),
        404,
        "no checkpoint",
    )
    _refused(api.http.get("/samplers/none"), 404, "unknown sampling_session_id 'none'")
    _refused(api.http.get("/training_runs/none"), 404, "unknown model_id 'none'")
    _alive(api)


def test_bad_sampling_requests_get_their_error(api: Any) -> None:
    base = api.server.backend.base_model_names()[0]
    sid = api.post("create_sampling_session", {"session_id": api.session(), "base_model": base}).json()
    ok = {
        "sampling_session_id": sid["sampling_session_id"],
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 5]}]},
    }
    _refused(api.post("asample", {**ok, "num_samples": 10**6}), 422, "num_samples must be")
    _refused(api.post("asample", {**ok, "sampling_params": [1]}), 422, "sampling_params must be an object")
    _refused(
        api.post("asample", {**ok, "prompt": {"chunks": [{"type": "image"}]}}),
        422,
        "encoded_text chunks only",
    )
    body = {**ok, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 10**8]}]}}
    out = api.result(api.post("asample", body).json())
    assert out["category"] == "user" and "outside the vocabulary" in out["error"]
    body["prompt"] = {"chunks": []}
    assert "the prompt is empty" in api.result(api.post("asample", body).json())["error"]
    _alive(api)


def test_a_client_gone_mid_request_or_mid_sequence_loses_nothing_for_others(
    api: Any, tinker_server: TinkerServer
) -> None:
    session = api.session()
    model = api.model(session)
    raw = encode_forward_backward_request(model, 1, [DATUM], "cross_entropy")
    with socket.create_connection(("127.0.0.1", tinker_server.port), timeout=10) as sock:
        head = (
            "POST /api/v1/forward_backward HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {len(raw)}\r\n\r\n"
        ).encode()
        sock.sendall(head + raw[: len(raw) // 2])  # half a body, then gone
    # its model was never touched: seq_id 1 is still free, and runs
    assert api.result(fwd_bwd(api, model, 1, [DATUM]))["metrics"]["loss:sum"] > 0
    # a client that sends seq_id 3 and goes away without seq_id 2: only its own model waits...
    held = optim(api, model, 3)
    assert tinker_server.api.queue.waiting(model) == [3]
    _alive(api)
    # ...until its session finishes: the held operation resolves to an error that says why
    assert api.post(f"sessions/{session}/finish", {"reason": {"type": "interrupted"}}).status_code == 200
    out = api.result(held)
    assert out["category"] == "user" and "seq_id 3 of model" in out["error"] and "never ran" in out["error"]
    _refused(
        api.post("optim_step", {"model_id": model, "seq_id": 4, "adam_params": {}}), 404, "unknown model id"
    )
    rollouts = [r for r in tinker_server.store.rollouts() if r.metadata.get("tinker.session_id") == session]
    assert [r.status for r in rollouts] == ["failed"] and "interrupted" in (rollouts[0].error or "")


def test_two_clients_racing_on_one_model_each_get_an_answer(api: Any, tinker_server: TinkerServer) -> None:
    session = api.session()
    model = api.model(session)
    bodies = [
        encode_forward_backward_request(model, 1, [DATUM], "cross_entropy"),
        encode_forward_backward_request(model, 1, [DATUM], "cross_entropy", forward_only=True),
    ]
    answers: list[httpx.Response] = []
    barrier = threading.Barrier(2)

    def client(raw: bytes) -> None:
        with httpx.Client(base_url=f"{tinker_server.url}/api/v1", timeout=60) as http:
            barrier.wait()
            answers.append(http.post("/forward_backward", content=raw, headers=PROTO))

    threads = [threading.Thread(target=client, args=(b,)) for b in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(r.status_code for r in answers) == [200, 422]
    lost = next(r for r in answers if r.status_code == 422)
    _refused(lost, 422, f"seq_id 1 of model {model!r} was already submitted with a different request")
    won = next(r for r in answers if r.status_code == 200)
    assert api.result(won.json())["metrics"]["loss:sum"] > 0
    # the same model_seq_id created twice: the second is told
    body = {
        "session_id": session,
        "model_seq_id": 0,
        "base_model": tinker_server.backend.base_model_names()[0],
    }
    _refused(api.post("create_model", body), 422, "already exists")
    _alive(api)


@pytest.mark.parametrize("route", ["create_model", "optim_step", "save_weights", "asample", "load_weights"])
def test_json_routes_refuse_what_is_not_a_json_object(api: Any, route: str) -> None:
    _refused(api.http.post(f"/{route}", content=b"{not json"), 422, "not JSON")
    _refused(api.post(route, [1, 2]), 422, "must be a JSON object")


def test_bodies_over_the_limit_get_a_413_that_says_it(api: Any, tinker_server: TinkerServer) -> None:
    """A body past ``max_body_bytes`` (declared or streamed), and a small zstd body that decompresses
    past it, are refused with a 413 naming the limit; the server serves on."""
    import zstandard

    model = api.model(api.session())
    limit = 4096
    tinker_server.api.max_body_bytes = limit
    try:
        big = Datum([5] * 2000, {"target_tokens": [6] * 2000, "weights": [1.0] * 2000})  # compresses well
        raw = encode_forward_backward_request(model, 1, [big], "cross_entropy")
        assert len(raw) > limit
        _refused(_post_proto(api, raw), 413, f"this server takes at most {limit}")

        def chunks() -> Any:  # streamed: no Content-Length to refuse it by
            yield raw[:limit]
            yield raw[limit:]

        _refused(_post_proto(api, chunks()), 413, f"this server takes at most {limit}")
        bomb = zstandard.ZstdCompressor().compress(raw)
        assert len(bomb) < limit
        _refused(
            _post_proto(api, bomb, **{"content-encoding": "zstd"}),
            413,
            f"the decompressed forward_backward body is more than {limit} bytes",
        )
        _refused(api.post("create_session", {"tags": ["x" * limit]}), 413, "request body is")
        # a body under the limit, compressed (in two frames), is taken whole
        small = encode_forward_backward_request(model, 1, [DATUM], "cross_entropy")
        half = len(small) // 2
        frames = zstandard.ZstdCompressor().compress(small[:half]) + zstandard.ZstdCompressor().compress(
            small[half:]
        )
        assert api.result(_post_proto(api, frames, **{"content-encoding": "zstd"}).json())["metrics"]
        # and in one frame
        small = encode_forward_backward_request(model, 2, [DATUM], "cross_entropy")
        zipped = zstandard.ZstdCompressor().compress(small)
        assert api.result(_post_proto(api, zipped, **{"content-encoding": "zstd"}).json())["metrics"]
    finally:
        tinker_server.api.max_body_bytes = MAX_BODY_BYTES
    _alive(api)
