"""Truncated sampling (top-p, top-k, min-p) on training rollouts: the server samples from the full
tempered distribution instead, the one the trainer scores, and records what was asked; ``refuse``
answers 400; evaluation rollouts and unrouted calls sample as asked."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from agentlightning_lite.serving.engines import GenRequest, GenResult, ScriptedEngine

pytest.importorskip("starlette")


class Recording(ScriptedEngine):
    """A scripted engine that keeps every request it serves."""

    def __init__(self) -> None:
        super().__init__(["ok"], tokenizer="bytes", model_name="m")
        self.seen: list[GenRequest] = []

    def _one(self, req: GenRequest) -> GenResult:
        self.seen.append(req)
        return super()._one(req)


def _chat(url: str, **sampling: Any) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **sampling}
    return httpx.post(f"{url}/chat/completions", json=body, timeout=30)


def _params(store: Any, rollout_id: str) -> dict[str, Any]:
    (span,) = [s for s in store.spans(rollout_id) if s.kind == "llm"]
    return dict(span.attributes["params"])


def test_a_training_rollout_samples_untruncated_and_records_what_it_asked(
    serve: Any, store: Any, caplog: pytest.LogCaptureFixture
) -> None:
    engine = Recording()
    server = serve(engine, store)
    train = store.start_rollout("t", mode="train")
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.serving.routes.calls"):
        assert (
            _chat(server.llm(train.rollout_id).base_url, top_p=0.8, top_k=20, temperature=0.7).status_code
            == 200
        )
        assert _chat(server.llm(train.rollout_id).base_url, min_p=0.1).status_code == 200
    first, second = engine.seen
    assert (first.top_p, first.top_k, first.min_p, first.temperature) == (1.0, 0, 0.0, 0.7)
    assert (second.top_p, second.top_k, second.min_p) == (1.0, 0, 0.0)
    params = [dict(s.attributes["params"]) for s in store.spans(train.rollout_id) if s.kind == "llm"]
    assert params[0]["truncation_ignored"] == {"top_p": 0.8, "top_k": 20}
    assert params[0]["top_p"] == 1.0 and "top_k" not in params[0] and params[0]["temperature"] == 0.7
    assert params[1]["truncation_ignored"] == {"min_p": 0.1}
    warned = [r for r in caplog.records if "truncated sampling" in r.getMessage()]
    assert len(warned) == 1  # once per server


def test_a_training_rollouts_penalties_are_neutralised_and_recorded(serve: Any, store: Any) -> None:
    """Penalties reshape the sampled distribution as truncation does (the trainer scores neither):
    a training rollout's call samples without them and records what it asked for; "refuse" names them."""
    engine = Recording()
    server = serve(engine, store)
    train = store.start_rollout("t", mode="train")
    asked = {"presence_penalty": 0.5, "frequency_penalty": -0.2, "repetition_penalty": 1.3}
    assert _chat(server.llm(train.rollout_id).base_url, top_p=0.9, **asked).status_code == 200
    (req,) = engine.seen
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty, req.top_p) == (0, 0, 1, 1)
    params = _params(store, train.rollout_id)
    assert params["truncation_ignored"] == {"top_p": 0.9, **asked}
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty"} & set(params)
    val = store.start_rollout("v", mode="val")  # evaluation keeps them
    assert _chat(server.llm(val.rollout_id).base_url, repetition_penalty=1.3).status_code == 200
    assert engine.seen[-1].repetition_penalty == 1.3
    refusing = serve(engine, store, truncated_sampling="refuse")
    r = _chat(refusing.llm(train.rollout_id).base_url, repetition_penalty=1.3)
    assert r.status_code == 400 and "repetition_penalty=1.3" in r.json()["error"]["message"]


def test_evaluation_and_unrouted_calls_keep_their_truncation(serve: Any, store: Any) -> None:
    engine = Recording()
    server = serve(engine, store)
    val = store.start_rollout("v", mode="val")
    assert _chat(server.llm(val.rollout_id).base_url, top_p=0.5, top_k=3).status_code == 200
    assert _chat(server.base_url, top_p=0.5).status_code == 200
    assert [(r.top_p, r.top_k) for r in engine.seen] == [(0.5, 3), (0.5, 0)]
    assert "truncation_ignored" not in _params(store, val.rollout_id)


def test_refuse_answers_400_and_keep_samples_as_asked(serve: Any, store: Any) -> None:
    engine = Recording()
    refusing = serve(engine, store, truncated_sampling="refuse")
    train = store.start_rollout("t", mode="train")
    r = _chat(refusing.llm(train.rollout_id).base_url, top_p=0.8)
    assert r.status_code == 400
    assert (
        r.json()["error"]["code"] == "truncated_sampling_refused"
        and "top_p=0.8" in r.json()["error"]["message"]
    )
    assert _chat(refusing.llm(train.rollout_id).base_url, top_p=1.0).status_code == 200  # untruncated: served
    keeping = serve(engine, store, truncated_sampling="keep")
    assert _chat(keeping.llm(train.rollout_id).base_url, top_p=0.8).status_code == 200
    assert [r.top_p for r in engine.seen] == [1.0, 0.8]
    with pytest.raises(ValueError, match="truncated_sampling"):
        serve(engine, store, truncated_sampling="drop")


def test_completions_route_neutralises_truncation_too(serve: Any, store: Any) -> None:
    engine = Recording()
    server = serve(engine, store)
    train = store.start_rollout("t", mode="train")
    body = {"model": "m", "prompt": "hi", "max_tokens": 4, "top_p": 0.3}
    assert (
        httpx.post(f"{server.llm(train.rollout_id).base_url}/completions", json=body, timeout=30).status_code
        == 200
    )
    assert engine.seen[0].top_p == 1.0
    assert _params(store, train.rollout_id)["truncation_ignored"] == {"top_p": 0.3}
