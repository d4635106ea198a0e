"""One exception family, mapped to HTTP status only at the edge.

Errors a caller causes are ``AGLError``s and get their 4xx; any other exception inside a handler
is a bug in the server: a 500 with a generic message, its traceback in the log, never a 4xx.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.errors import (
    AGLError,
    ConflictError,
    InvalidRequestError,
    LeaseError,
    RolloutExistsError,
    UnknownRolloutError,
)
from agentlightning_lite.remote.queue import LeaseMismatch, OutcomeCounted, RolloutQueue


def test_the_package_raises_its_family_for_what_callers_do() -> None:
    store = agl.MemoryStore()
    with pytest.raises(UnknownRolloutError, match="unknown rollout 'nope'") as info:
        store.finish_rollout("nope")
    assert isinstance(info.value, KeyError) and info.value.rollout_id == "nope"
    with pytest.raises(UnknownRolloutError):
        store.set_reward("nope", 1.0)
    rid = store.start_rollout("t").rollout_id
    with pytest.raises(RolloutExistsError) as exists:
        store.start_rollout("t", rollout_id=rid)
    assert isinstance(exists.value, ConflictError) and isinstance(exists.value, ValueError)
    queue = RolloutQueue(store)
    with pytest.raises(UnknownRolloutError):
        queue.complete("nope", "succeeded")
    with pytest.raises(InvalidRequestError):
        queue.complete("nope", "running")
    assert issubclass(LeaseMismatch, LeaseError) and issubclass(LeaseError, PermissionError)
    assert issubclass(OutcomeCounted, ConflictError)
    assert all(issubclass(c, AGLError) for c in (UnknownRolloutError, LeaseError, ConflictError))
    from agentlightning_lite.remote import RemoteError
    from agentlightning_lite.remote.otlp import OTLPError
    from agentlightning_lite.serving.chat_format import ChatFormatError
    from agentlightning_lite.serving.structured import ResponseFormatError
    from agentlightning_lite.store import NotOurDatabase

    assert issubclass(RemoteError, AGLError)
    for cls in (OTLPError, ChatFormatError, ResponseFormatError, NotOurDatabase):
        assert issubclass(cls, InvalidRequestError) and issubclass(cls, ValueError), cls


def _boom(exc: Exception) -> Callable[..., object]:
    def raise_(*args: object, **kwargs: object) -> object:
        raise exc

    return raise_


@pytest.mark.parametrize(
    ("method", "path", "body", "attr", "exc"),
    [
        ("GET", "/agl/v1/rollouts/{rid}", None, "get_rollout", KeyError("internal-key-detail")),
        ("GET", "/agl/v1/rollouts/{rid}/spans", None, "spans", KeyError("internal-key-detail")),
        ("GET", "/agl/v1/rollouts", None, "rollouts", ValueError("internal-value-detail")),
        ("POST", "/agl/v1/rollouts/{rid}/complete", {"status": "succeeded"}, "finish_rollout",
         ValueError("internal-value-detail")),
        ("POST", "/agl/v1/rollouts/{rid}/reward", {"reward": 1.0}, "set_reward",
         KeyError("internal-key-detail")),
        ("POST", "/agl/v1/spans", {"rows": []}, "add_span_rows", ValueError("internal-value-detail")),
        ("POST", "/rollout/{rid}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]},
         "add_spans", ValueError("internal-value-detail")),
    ],
)  # fmt: skip
def test_an_internal_error_in_a_handler_is_a_500_not_a_client_error(
    served: Callable[..., agl.RemoteRunners],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    method: str,
    path: str,
    body: object,
    attr: str,
    exc: Exception,
) -> None:
    store = agl.MemoryStore()
    runners = served(store)
    rid = store.start_rollout("t").rollout_id
    if path == "/agl/v1/spans":
        body = {"rows": [[ "s1", rid, None, "tool", "t", None, 1.0, 2.0, "ok", None, "null", "null", "{}",
                           None, None, None, None]]}  # fmt: skip
    runners.server.rollouts.remember(rid)  # the routes need no lookup to find it
    monkeypatch.setattr(store, attr, _boom(exc))
    caplog.set_level(logging.ERROR)
    with httpx.Client(base_url=runners.url) as http:
        r = http.request(method, path.format(rid=rid), json=body)
        assert r.status_code == 500, r.text
        err = r.json()["error"]
        assert err["code"] == "internal_error" and err["type"] == "server_error"
        assert "detail" not in r.text and type(exc).__name__ not in r.text  # nothing internal leaks
        monkeypatch.undo()
        assert http.get("/agl/v1/status").status_code == 200  # and the server keeps serving
    assert any(rec.exc_info and "detail" in str(rec.exc_info[1]) for rec in caplog.records)


def test_a_real_unknown_rollout_is_a_404_and_a_real_bad_body_a_400(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store)
    with httpx.Client(base_url=runners.url) as http:
        for method, path, body in [
            ("GET", "/agl/v1/rollouts/nope", None),
            ("GET", "/agl/v1/rollouts/nope/spans", None),
            ("POST", "/agl/v1/rollouts/nope/complete", {"status": "succeeded"}),
            ("POST", "/agl/v1/rollouts/nope/reward", {"reward": 1.0}),
            ("POST", "/rollout/nope/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ]:
            r = http.request(method, path, json=body)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["error"]["code"] == "rollout_not_found"
        for path, body in [
            ("/agl/v1/claim", {"worker": "w", "wait": -1}),
            ("/agl/v1/claim", {"wait": 0}),
            ("/agl/v1/spans", {"rows": [["too", "short"]]}),
            ("/agl/v1/rollouts", {"mode": "nonsense"}),
        ]:
            r = http.post(path, json=body)
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error"
        rid = store.start_rollout("t").rollout_id
        r = http.post("/agl/v1/rollouts", json={"rollout_id": rid})
        assert r.status_code == 409 and "exists already" in r.json()["error"]["message"]
