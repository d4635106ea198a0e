"""Fuzz OpenTelemetry ingestion: spans with any attributes (GenAI keys with wrong types, our own
``agentlightning.*`` keys holding garbage) become a Span or a clear ``ValueError``; a live processor
never raises into the instrumented program and writes nothing half-way."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentlightning_lite as agl

pytest.importorskip("opentelemetry.sdk")
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

from .strategies import hostile_text

# OTel attribute values: str, bool, int, float, or homogeneous sequences of them
scalar = st.one_of(hostile_text, st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats())
value = st.one_of(
    scalar,
    st.lists(st.integers(-(2**40), 2**40), max_size=4),
    st.lists(hostile_text, max_size=3),
    st.lists(st.floats(), max_size=3),
)
keys = st.sampled_from(
    ["gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.agent.name",
     "gen_ai.tool.name", "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.id",
     "gen_ai.prompt.0.content", "gen_ai.completion.0.role", "agentlightning.kind", "agentlightning.span_id",
     "agentlightning.rollout_id", "agentlightning.parent_id", "agentlightning.input", "agentlightning.output",
     "agentlightning.attributes", "agentlightning.prompt_token_ids", "agentlightning.response_token_ids",
     "agentlightning.response_logprobs", "error.type"]
) | hostile_text  # fmt: skip
attributes = st.dictionaries(keys, value, max_size=8)


def _span(attrs: dict[str, Any], error: bool, name: str) -> ReadableSpan:
    ctx = SpanContext(0x1234, 0x99, False, TraceFlags(1))
    return ReadableSpan(
        name=name,
        context=ctx,
        parent=None,
        attributes=attrs,
        start_time=1_000_000_000,
        end_time=2_000_000_000,
        status=Status(StatusCode.ERROR if error else StatusCode.UNSET, "boom" if error else None),
    )


@given(attrs=attributes, error=st.booleans(), name=hostile_text)
def test_from_otel_gives_a_span_or_a_clear_error(attrs: dict[str, Any], error: bool, name: str) -> None:
    try:
        span = agl.otel.from_otel(_span(attrs, error, name), "r1")
    except ValueError as exc:
        assert "OTel span" in str(exc)
        return
    assert span.rollout_id == "r1" and span.kind in (
        "llm",
        "tool",
        "agent",
        "chain",
        "reward",
        "signal",
        "custom",
    )
    assert (span.status == "error") == error


@given(attrs=attributes)
def test_ingest_refuses_bad_spans_whole(attrs: dict[str, Any]) -> None:
    tracer = agl.Tracer()
    proc = agl.otel.SpanProcessor(tracer)
    with tracer.rollout("q") as ro:
        good = _span({"gen_ai.operation.name": "chat"}, False, "ok")
        try:
            n = proc.ingest([good, _span({**attrs, "agentlightning.rollout_id": ro.id}, False, "fuzzed")])
        except ValueError as exc:
            assert "fuzzed" in str(exc)
            n = None
    spans = tracer.store.spans(ro.id)
    names = sorted(s.name for s in spans)
    if n is None:
        assert names == ["ok"]  # the good span kept, the bad one not written at all
    else:
        assert n == 2


def test_a_live_processor_never_raises_into_the_program(caplog: pytest.LogCaptureFixture) -> None:
    provider = TracerProvider()
    tracer = agl.Tracer()
    provider.add_span_processor(agl.otel.SpanProcessor(tracer))
    otel = provider.get_tracer("fuzz")
    with caplog.at_level(logging.WARNING), tracer.rollout("q") as ro:
        with otel.start_as_current_span("bad") as s:
            s.set_attribute("agentlightning.prompt_token_ids", ["not", "ids"])
        with otel.start_as_current_span("good") as s:
            s.set_attribute("gen_ai.operation.name", "chat")
    assert [s.name for s in tracer.store.spans(ro.id)] == ["good"]
    assert "bad" in caplog.text and "prompt_token_ids" in caplog.text
