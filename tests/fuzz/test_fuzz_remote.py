"""Fuzz the runner routes (rollout queue, span ingestion, OTLP/HTTP) over real HTTP on 127.0.0.1:
any body gets a 4xx JSON error (or a 2xx when it was valid), never a 5xx, and the server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentlightning_lite as agl
from agentlightning_lite.serving.engines import ScriptedEngine

from .strategies import hostile_text, json_values, numbers

POSTS = [
    "/agl/v1/claim",
    "/agl/v1/heartbeat",
    "/agl/v1/spans",
    "/agl/v1/rollouts",
    "/agl/v1/rollouts/nope/complete",
    "/agl/v1/rollouts/nope/reward",
    "/v1/traces",
]


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    runners = agl.RemoteRunners(port=0, max_body_bytes=256 * 1024)
    runners.serve(ScriptedEngine(["4"], tokenizer="bytes"), agl.MemoryStore(), 30.0)
    server = runners.server
    assert server is not None
    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c
    runners.stop()
    server.stop()


def _check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, resp.text
    if resp.status_code >= 400:
        assert isinstance(resp.json()["error"]["message"], str)


def _alive(client: httpx.Client) -> None:
    assert client.get("/agl/v1/status").status_code == 200


# OTLP/JSON shaped documents with garbage in every slot
any_value = st.one_of(
    st.fixed_dictionaries({"stringValue": json_values}),
    st.fixed_dictionaries({"intValue": st.one_of(numbers, hostile_text)}),
    st.fixed_dictionaries(
        {"arrayValue": st.fixed_dictionaries({"values": st.lists(json_values, max_size=3)})}
    ),
    json_values,
)
otlp_span = st.fixed_dictionaries(
    {},
    optional={
        "traceId": st.one_of(hostile_text, st.just("0" * 32)),
        "spanId": st.one_of(hostile_text, st.just("0" * 16)),
        "parentSpanId": json_values,
        "name": json_values,
        "startTimeUnixNano": st.one_of(numbers, hostile_text),
        "endTimeUnixNano": st.one_of(numbers, hostile_text),
        "attributes": st.one_of(
            st.lists(st.fixed_dictionaries({"key": json_values, "value": any_value}), max_size=4), json_values
        ),
        "status": json_values,
    },
)
otlp_doc = st.fixed_dictionaries(
    {
        "resourceSpans": st.one_of(
            json_values,
            st.lists(
                st.fixed_dictionaries(
                    {
                        "scopeSpans": st.lists(
                            st.fixed_dictionaries({"spans": st.lists(otlp_span, max_size=3)}), max_size=2
                        )
                    },
                    optional={"resource": json_values},
                ),
                max_size=2,
            ),
        )
    }
)


@given(path=st.sampled_from(POSTS), body=json_values)
def test_any_json_on_every_route(client: httpx.Client, path: str, body: Any) -> None:
    _check(client.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"}))


@given(doc=otlp_doc)
def test_otlp_json_documents(client: httpx.Client, doc: Any) -> None:
    _check(
        client.post(
            "/v1/traces", content=json.dumps(doc).encode(), headers={"content-type": "application/json"}
        )
    )


@given(
    raw=st.binary(max_size=400),
    ctype=st.sampled_from(["application/x-protobuf", "application/json", "text/x"]),
)
def test_otlp_any_bytes(client: httpx.Client, raw: bytes, ctype: str) -> None:
    _check(client.post("/v1/traces", content=raw, headers={"content-type": ctype}))


@given(rows=st.lists(st.lists(json_values, max_size=18), max_size=3))
def test_span_rows(client: httpx.Client, rows: Any) -> None:
    raw = json.dumps(
        {"rows": rows}
    ).encode()  # NaN/Infinity literals and \u escapes, as a sloppy client sends
    _check(client.post("/agl/v1/spans", content=raw, headers={"content-type": "application/json"}))


@pytest.mark.parametrize("path", POSTS)
def test_deep_nesting_and_oversized_bodies(client: httpx.Client, path: str) -> None:
    deep = "[" * 50_000 + "]" * 50_000
    _check(client.post(path, content=deep.encode(), headers={"content-type": "application/json"}))
    big = client.post(path, content=b"x" * 300_000, headers={"content-type": "application/json"})
    assert big.status_code == 413
    _alive(client)
