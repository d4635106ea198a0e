"""A rollout's handle owns what the rollout records while it runs (rewards, instant spans, the prompts
it was given) and its end; a store's rollout records go through its public hooks, which a wrapping
store forwards."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import agentlightning_lite as agl


def test_the_handle_records_rewards_instants_and_reads_its_prompts(tracer: agl.Tracer) -> None:
    meta = {"prompts": {"writer/system": "Be brief.", "n": 3}}
    with tracer.rollout("task", metadata=meta) as ro, tracer.span("agent", "writer", agent="writer"):
        ro.record_reward(0.25, name="format")
        assert ro.final_reward == 0.25
        assert ro.record_instant("signal", "checked", output=4, attributes={"signal_status": "ok"})
        reads = [
            ro.record_instant("custom", "agl.prompt", "Be brief.", once="writer/system") for _ in range(3)
        ]
        assert reads == [True, False, False]
        assert dict(ro.prompts) == {"writer/system": "Be brief.", "n": "3"}
        assert agl.prompt("system", agent="writer") == "Be brief."
        ro.record_reward(1.0, final=True)
    spans = [(s.kind, s.name, s.agent, s.output) for s in tracer.store.spans(ro.id)]
    assert spans == [  # agl.prompt's read of "writer/system" was recorded already: once per rollout
        ("agent", "writer", "writer", None),
        ("reward", "format", "writer", 0.25),
        ("signal", "checked", "writer", 4),
        ("custom", "agl.prompt", "writer", "Be brief."),
        ("reward", "reward", "writer", 1.0),
    ]
    rollout = tracer.store.get_rollout(ro.id)
    assert rollout is not None and (rollout.status, rollout.reward) == ("succeeded", 1.0)


def test_what_an_ended_rollout_is_given_is_dropped_and_logged(
    tracer: agl.Tracer, caplog: pytest.LogCaptureFixture
) -> None:
    with tracer.rollout("task") as ro:
        ro.record_reward(0.5)
    with caplog.at_level(logging.WARNING, logger="agentlightning_lite.rollout_handle"):
        assert ro.record_instant("signal", "late") is False
        ro.record_reward(1.0, final=True)
    assert "dropped signal 'late'" in caplog.text
    assert [s.kind for s in tracer.store.spans(ro.id)] == ["reward"]
    assert tracer.store.get_rollout(ro.id).reward == 0.5  # type: ignore[union-attr]


def test_give_up_and_finish_end_the_rollout_once(tracer: agl.Tracer) -> None:
    with tracer.rollout("slow") as ro:
        ro.record_reward(0.5)
        tracer.store.close_rollout(ro.id, status="timeout")  # a trainer's timeout
        assert ro.give_up() is True and ro.give_up() is False
        ro.finish()  # given up: nothing
    timed_out = tracer.store.get_rollout(ro.id)
    assert timed_out is not None and (timed_out.status, timed_out.reward) == ("timeout", None)

    other = tracer.rollout("by hand")
    other.record_reward(0.75)
    other.finish(status="timeout")
    other.finish()  # once only
    assert other.give_up() is False  # it had ended already
    got = tracer.store.get_rollout(other.id)
    assert got is not None and (got.status, got.reward) == ("timeout", 0.75)


def test_the_handle_refuses_bad_input_with_the_cause(tracer: agl.Tracer) -> None:
    with tracer.rollout("task") as ro:
        with pytest.raises(ValueError, match="finite number, got None"):
            ro.reward(None)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="use record_reward"):
            ro.record_instant("reward", "r", 1.0)
        with pytest.raises(ValueError, match="'note'"):
            ro.record_instant("note", "x")
        with pytest.raises(ValueError, match="'maybe'"):
            ro.record_instant("signal", "x", status="maybe")
        with pytest.raises(ValueError, match="'running'"):
            ro.finish(status="running")
    assert tracer.store.spans(ro.id) == []  # nothing half-written: the store still reads
    assert tracer.store.get_rollout(ro.id).status == "succeeded"  # type: ignore[union-attr]


def test_a_wrapping_store_forwards_the_rollout_record_hooks(store: agl.Store) -> None:
    exporter = InMemorySpanExporter()
    mirror = agl.otel.MirrorStore(store, exporter)
    mirror.insert_rollout(agl.Rollout(rollout_id="r1", task="t", start_time=1.0))
    record = mirror.rollout_for_update("r1")
    assert record is not None and record.status == "running"
    mirror.update_rollout(record.model_copy(update={"metadata": {"note": "checked"}}))
    assert store.rollout_for_update("r1").metadata == {"note": "checked"}  # type: ignore[union-attr]
    done = mirror.finish_rollout("r1", reward=1.0)
    assert (done.status, done.reward, done.metadata) == ("succeeded", 1.0, {"note": "checked"})
    assert store.get_rollout("r1") == done
    assert mirror.rollout_for_update("missing") is None
