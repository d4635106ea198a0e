"""Fuzz the Tinker server over real HTTP on 127.0.0.1: any JSON on every route, any bytes and mutated
protobuf on ``/forward_backward``. Every answer is a 2xx or a 4xx with ``{"error", "category"}`` (never
a 5xx, never a traceback); an accepted operation resolves to a result or to a ``user`` error; and the
server keeps training."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from .strategies import hostile_text, json_values

pytest.importorskip("peft")

from agentlightning_lite.tinker import Datum, OpError, TinkerServer, build_backend
from agentlightning_lite.tinker.wire import (
    decode_forward_backward_request,
    decode_message,
    encode_forward_backward_request,
)

POST_ROUTES = [
    "client/config",
    "create_session",
    "session_heartbeat",
    "telemetry",
    "create_model",
    "get_info",
    "optim_step",
    "save_weights",
    "save_weights_for_sampler",
    "load_weights",
    "create_sampling_session",
    "asample",
    "retrieve_future",
    "weights_info",
    "sessions/x/finish",
]
PROTO = {"content-type": "application/x-protobuf"}
DATUM = Datum([1, 5, 9], {"target_tokens": [5, 9, 13], "weights": [0.0, 1.0, 1.0]})


class Live:
    """The server, a client, and a session with one model whose ids the strategies can use."""

    def __init__(self, server: TinkerServer) -> None:
        self.server = server
        self.http = httpx.Client(base_url=f"{server.url}/api/v1", timeout=60)
        self.session = self.http.post("/create_session", json={}).json()["session_id"]
        base = server.backend.base_model_names()[0]
        body = {"session_id": self.session, "model_seq_id": 0, "base_model": base, "lora_config": {"rank": 2}}
        future = self.http.post("/create_model", json=body).json()
        self.model = future["model_id"]  # the JSON fuzzing's to use
        self.result(future)
        future = self.http.post("/create_model", json={**body, "model_seq_id": 1}).json()
        self.proto_model = future["model_id"]  # the protobuf fuzzing's own, kept in seq_id order
        self.result(future)
        self.base = base
        self.seq = 0

    def result(self, future: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.http.post("/retrieve_future", json={"request_id": future["request_id"]})
            check(r)
            out = r.json()
            if out.get("type") != "try_again":
                return dict(out)
        raise AssertionError(f"{future} did not finish")


@pytest.fixture(scope="module")
def live(tiny_smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    backend = build_backend(str(tiny_smol), num_threads=1, seed=0)
    server = TinkerServer(backend, tmp_path_factory.mktemp("tinker-fuzz"), poll_s=0.2).start()
    client = Live(server)
    yield client
    client.http.close()
    server.close()


def check(resp: httpx.Response) -> dict[str, Any] | None:
    """A 2xx, or a 4xx with ``{"error", "category"}``; never a 5xx or a traceback. The error, if any."""
    assert resp.status_code < 500, resp.text
    assert "Traceback" not in resp.text
    if resp.status_code >= 400:
        body = resp.json()
        assert isinstance(body["error"], str) and body["error"]
        assert body["category"] in ("user", "server", "unknown")
        return dict(body)
    return None


def settle(live: Live, resp: httpx.Response, model: Any = None, seq_id: Any = None) -> None:
    """An accepted operation resolves to a result or to a ``user`` error (the request was wrong); one
    held for an earlier ``seq_id`` of its model that never came is left waiting."""
    if check(resp) is not None or not resp.headers["content-type"].startswith("application/json"):
        return
    out = resp.json()
    if not (isinstance(out, dict) and "request_id" in out):
        return
    if isinstance(model, str) and seq_id in live.server.api.queue.waiting(model):
        return
    result = live.result(out)
    assert result.get("category") in (None, "user"), result


#: JSON bodies that look like the routes' own, with the live ids mixed in and any value in any field
def _bodies(live_ids: dict[str, Any]) -> st.SearchStrategy[Any]:
    field = st.one_of(json_values, st.sampled_from(list(live_ids.values())))
    keys = st.sampled_from(
        [
            "session_id",
            "model_id",
            "model_seq_id",
            "seq_id",
            "base_model",
            "lora_config",
            "adam_params",
            "path",
            "model_path",
            "sampling_session_id",
            "prompt",
            "num_samples",
            "sampling_params",
            "request_id",
            "tinker_path",
            "optimizer",
            "reason",
        ]
    )
    return st.one_of(json_values, st.dictionaries(st.one_of(keys, hostile_text), field, max_size=6))


@given(route=st.sampled_from(POST_ROUTES), data=st.data())
@example(route="asample", data=None)
def test_any_json_on_any_route(live: Live, route: str, data: Any) -> None:
    ids = {
        "session": live.session,
        "model": live.model,
        "base": live.base,
        "path": f"tinker://{live.model}/weights/x",
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}]},
        "params": {"max_tokens": 2},
        "lora": {"rank": 2},
    }
    body = (
        {"base_model": live.base, "prompt": ids["prompt"], "sampling_params": {"max_tokens": 1, "stop": []}}
        if data is None
        else data.draw(_bodies(ids))
    )
    if isinstance(body, dict):  # keep what is accepted small: the run stays short
        if route == "create_model" and body.get("session_id") == live.session:
            body["lora_config"] = {"rank": 2}
        if isinstance(body.get("num_samples"), int) and body["num_samples"] > 2:
            body["num_samples"] = 2
    raw = json.dumps(body).encode()  # NaN/Infinity as JS literals, surrogates \\u-escaped
    resp = live.http.post(f"/{route}", content=raw, headers={"content-type": "application/json"})
    model, seq = (body.get("model_id"), body.get("seq_id")) if isinstance(body, dict) else (None, None)
    settle(live, resp, model, seq)


@given(raw=st.binary(max_size=300))
def test_any_bytes_as_protobuf(live: Live, raw: bytes) -> None:
    resp = live.http.post("/forward_backward", content=raw, headers=PROTO)
    assert check(resp) is not None  # no model id of this server comes out of random bytes


def _in_order(live: Live, raw: bytes) -> None:
    """Send ``raw`` as the next operation of the protobuf fuzzing's model; when it does not take that
    ``seq_id`` (refused, or another model or seq_id after all), the real request takes it."""
    resp = live.http.post("/forward_backward", content=raw, headers=PROTO)
    try:
        req = decode_forward_backward_request(raw)
    except OpError:
        req = None
    settle(live, resp, None if req is None else req.model_id, None if req is None else req.seq_id)
    took_it = (
        resp.status_code == 200
        and req is not None
        and (req.model_id, req.seq_id) == (live.proto_model, live.seq)
    )
    if not took_it:
        good = encode_forward_backward_request(live.proto_model, live.seq, [DATUM], "cross_entropy")
        resp = live.http.post("/forward_backward", content=good, headers=PROTO)
        settle(live, resp, live.proto_model, live.seq)


@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_protobuf(live: Live, flips: list[tuple[int, int]]) -> None:
    live.seq += 1
    raw = bytearray(encode_forward_backward_request(live.proto_model, live.seq, [DATUM], "cross_entropy"))
    for at, byte in flips:
        raw[at % len(raw)] = byte
    _in_order(live, bytes(raw))


_tensor = st.tuples(st.binary(max_size=48), st.integers(0, 5), st.lists(st.integers(0, 13), max_size=2))


@given(
    tokens=st.binary(max_size=24),
    inputs=st.dictionaries(
        st.sampled_from(["target_tokens", "weights", "logprobs", "advantages", "mask", ""]),
        _tensor,
        max_size=3,
    ),
    loss=st.sampled_from(["cross_entropy", "importance_sampling", "ppo", "cispo", "dro", ""]),
    config=st.dictionaries(
        st.sampled_from(["clip_low", "clip_high_threshold", "x"]), st.floats(), max_size=2
    ),
    forward_only=st.booleans(),
)
def test_protobuf_with_any_fields(
    live: Live, tokens: bytes, inputs: dict[str, Any], loss: str, config: dict[str, float], forward_only: bool
) -> None:
    live.seq += 1
    raw = encode_forward_backward_request(
        live.proto_model, live.seq, [DATUM], loss, forward_only=forward_only
    )
    msg = decode_message("ForwardBackwardRequest", raw)
    datum = msg.data[0]
    datum.model_input[0].encoded_text.tokens = tokens
    del datum.loss_fn_inputs[:]
    for key, (dense, dtype, shape) in inputs.items():
        entry = datum.loss_fn_inputs.add(key=key)
        entry.value.dense, entry.value.dtype = dense, dtype
        entry.value.shape.extend(shape)
    for key, value in config.items():
        msg.loss_fn_config.add(key=key, value=value)
    _in_order(live, bytes(msg.SerializeToString()))


def test_the_server_still_trains_after_the_fuzzing(live: Live) -> None:
    session = live.http.post("/create_session", json={}).json()["session_id"]
    body = {"session_id": session, "model_seq_id": 0, "base_model": live.base, "lora_config": {"rank": 2}}
    future = live.http.post("/create_model", json=body).json()
    live.result(future)
    raw = encode_forward_backward_request(future["model_id"], 1, [DATUM], "cross_entropy")
    out = live.result(live.http.post("/forward_backward", content=raw, headers=PROTO).json())
    assert out["metrics"]["loss:sum"] > 0
