"""Tracer behaviour against both stores: nesting, agents, rewards, errors, concurrency."""

from __future__ import annotations

import asyncio
import contextvars
import math
import os
import socket
import threading
import warnings

import pytest

import agentlightning_lite as agl
from agentlightning_lite import tracer as tracer_module


def run_agent(tracer: agl.Tracer, question: str) -> str:
    """A plain Python agent: agent -> llm -> tool -> llm."""
    with tracer.rollout({"question": question}, mode="train") as ro:
        with tracer.span("agent", "solver", agent="solver", input=question):
            with tracer.span("llm", "chat", input=[{"role": "user", "content": question}], model="m") as sp:
                sp.set_output(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "calc", "arguments": '{"e": "2+3"}'},
                            }
                        ],
                    }
                )
                sp.set_tokens([1, 2, 3], [4, 5], [-0.1, -0.2])
            with tracer.span("tool", "calc", input={"e": "2+3"}, attributes={"tool_call_id": "call_1"}) as t:
                t.set_output(5)
            with tracer.span("llm", "chat", input="result 5", model="m") as sp:
                sp.set_output("The answer is 5")
        ro.reward(1.0)
    return ro.id


def test_nested_spans_parents_and_agent_inheritance(tracer: agl.Tracer) -> None:
    rid = run_agent(tracer, "2+3?")
    spans = tracer.store.spans(rid)
    by_kind = [(s.kind, s.name) for s in spans]
    assert by_kind == [
        ("agent", "solver"),
        ("llm", "chat"),
        ("tool", "calc"),
        ("llm", "chat"),
        ("reward", "reward"),
    ]
    agent_span = spans[0]
    assert agent_span.parent_id is None
    for child in spans[1:4]:
        assert child.parent_id == agent_span.span_id
        assert child.agent == "solver"  # inherited from the agent span
        assert child.rollout_id == rid
        assert child.end_time is not None and child.end_time >= child.start_time
    llm = spans[1]
    assert llm.prompt_token_ids == [1, 2, 3]
    assert llm.response_token_ids == [4, 5]
    assert llm.response_logprobs == [-0.1, -0.2]
    assert llm.model == "m"
    assert spans[2].output == 5 and spans[2].input == {"e": "2+3"}
    ro = tracer.store.get_rollout(rid)
    assert ro.status == "succeeded" and ro.reward == 1.0 and ro.mode == "train"
    assert ro.task == {"question": "2+3?"}
    assert spans[-1].attributes == {"reward": 1.0, "final": True}


def test_exception_marks_rollout_failed_and_reraises(tracer: agl.Tracer) -> None:
    with pytest.raises(ZeroDivisionError):
        with tracer.rollout("boom") as ro:
            with tracer.span("tool", "divide"):
                _ = 1 / 0
    rollout = tracer.store.get_rollout(ro.id)
    assert rollout.status == "failed"
    assert rollout.error == "ZeroDivisionError: division by zero"
    (span,) = tracer.store.spans(ro.id)
    assert span.status == "error" and span.error == "ZeroDivisionError: division by zero"


def test_timeout_error_marks_rollout_timeout(tracer: agl.Tracer) -> None:
    with pytest.raises(TimeoutError):
        with tracer.rollout("slow") as ro:
            raise TimeoutError("took too long")
    assert tracer.store.get_rollout(ro.id).status == "timeout"


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "high"])
def test_bad_rewards_rejected(tracer: agl.Tracer, bad: object) -> None:
    with tracer.rollout("t") as ro:
        with pytest.raises(ValueError, match="finite number"):
            agl.emit_reward(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="finite number"):
            ro.reward(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="finite number"):
        tracer.store.finish_rollout(ro.id, reward=bad)  # type: ignore[arg-type]
    assert tracer.store.get_rollout(ro.id).reward is None


def test_unserialisable_payloads_stored_readably(tracer: agl.Tracer) -> None:
    class Weird:
        def __repr__(self) -> str:
            return "<Weird thing>"

    with tracer.rollout({"obj": Weird()}) as ro:
        with tracer.span("tool", "t", input={"x": Weird(), "s": {3, 1}, "b": b"\xff"}) as sp:
            sp.set_output(Weird())
            sp.set_attribute("nan", math.nan)
    (span,) = tracer.store.spans(ro.id)
    assert span.output == {
        "__type__": f"{__name__}.test_unserialisable_payloads_stored_readably.<locals>.Weird",
        "__repr__": "<Weird thing>",
    }
    assert span.input["s"] == [1, 3]
    assert span.input["b"] == {"__type__": "bytes", "base64": "/w=="}
    assert span.attributes["nan"] == "nan"
    assert tracer.store.get_rollout(ro.id).task["obj"]["__repr__"] == "<Weird thing>"


def test_last_emitted_reward_becomes_final(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        agl.emit_reward(0.3, name="partial")
        agl.emit_reward(0.8, name="judge")
    assert tracer.store.get_rollout(ro.id).reward == 0.8
    rewards = [(s.name, s.attributes["final"]) for s in tracer.store.spans(ro.id)]
    assert rewards == [("partial", False), ("judge", True)]


def test_emit_outside_rollout_warns_and_records_nothing(
    tracer: agl.Tracer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tracer_module, "_warned_outside", set())  # the warning comes once per process
    with tracer.rollout("t") as ro:
        agl.emit_signal("inside", value=1)
        agl.emit_reward(0.5, final=True)
    store = tracer.store
    spans_before = [(s.span_id, s.name, s.output) for s in store.spans(ro.id)]
    assert [name for _, name, _ in spans_before] == ["inside", "reward"]
    with pytest.warns(RuntimeWarning, match=r"agl\.emit_signal\(\) called outside a rollout: nothing was"):
        agl.emit_signal("lonely", value=2, status="error")
    with pytest.warns(RuntimeWarning, match=r"agl\.emit_reward\(\) called outside a rollout: nothing was"):
        agl.emit_reward(1.0, final=True)
    with warnings.catch_warnings():  # once per function: later calls are silent
        warnings.simplefilter("error")
        agl.emit_signal("lonely again")
        agl.emit_reward(0.0)
    # nothing recorded: no new rollout, the ended one keeps its spans and its reward
    (only,) = store.rollouts()
    assert only.rollout_id == ro.id and only.reward == 0.5 and only.status == "succeeded"
    assert [(s.span_id, s.name, s.output) for s in store.spans(ro.id)] == spans_before


def test_span_outside_rollout_opens_implicit_trace_rollout(tracer: agl.Tracer) -> None:
    with tracer.span("chain", "pipeline") as sp:
        with tracer.span("llm", "chat"):
            pass
    (ro,) = tracer.store.rollouts()
    assert ro.mode == "trace" and ro.status == "succeeded"
    assert [s.parent_id for s in tracer.store.spans(ro.rollout_id)] == [None, sp.id]


def test_signals_and_start_span_for_callbacks(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        root = tracer.start_span("chain", "graph", agent="writer")
        child = tracer.start_span("tool", "sql", parent_id=root.id, rollout_id=ro.id, agent="writer")
        with tracer.span("custom", "inner"):  # start_span(activate=False) does not become current
            pass
        child.end(output="rows", error="OperationalError: no such table")
        root.end(output="done")
        agl.emit_signal("sql_error", value=1, status="error", db="pets")
        with pytest.raises(RuntimeError, match="ended twice"):
            root.end()
    spans = {s.name: s for s in tracer.store.spans(ro.id)}
    assert spans["sql"].parent_id == spans["graph"].span_id
    assert spans["sql"].status == "error" and spans["sql"].output == "rows"
    assert spans["inner"].parent_id is None
    sig = spans["sql_error"]
    assert (
        sig.kind == "signal"
        and sig.status == "error"
        and sig.attributes == {"signal_status": "error", "db": "pets"}
    )


def test_context_follows_asyncio_tasks(tracer: agl.Tracer) -> None:
    async def step(i: int) -> None:
        with tracer.span("llm", f"call{i}"):
            await asyncio.sleep(0.01)
            agl.emit_reward(0.1 * i, name=f"r{i}")

    async def main() -> str:
        async with tracer.rollout("async") as ro:
            async with tracer.span("agent", "root", agent="a"):
                await asyncio.gather(*(step(i) for i in range(3)))
        return ro.id

    rid = asyncio.run(main())
    spans = tracer.store.spans(rid)
    root = next(s for s in spans if s.name == "root")
    calls = {s.name: s for s in spans if s.kind == "llm"}
    assert set(calls) == {"call0", "call1", "call2"}
    assert all(c.parent_id == root.span_id and c.agent == "a" for c in calls.values())
    for s in spans:
        if s.kind == "reward":  # each reward is the child of its own task's span
            assert calls[f"call{s.name[1]}"].span_id == s.parent_id


def test_threads_with_copied_context(tracer: agl.Tracer) -> None:
    with tracer.rollout("threads") as ro:
        with tracer.span("agent", "root") as root:

            def work(i: int) -> None:
                with tracer.span("tool", f"t{i}"):
                    pass

            threads = [
                threading.Thread(target=contextvars.copy_context().run, args=(work, i)) for i in range(8)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    tools = [s for s in tracer.store.spans(ro.id) if s.kind == "tool"]
    assert len(tools) == 8 and all(t.parent_id == root.id for t in tools)


def test_many_rollouts_in_threads(tracer: agl.Tracer) -> None:
    def one(i: int) -> None:
        with tracer.rollout({"i": i}) as ro:
            for j in range(20):
                with tracer.span("llm", f"c{j}"):
                    pass
            ro.reward(float(i))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rollouts = tracer.store.rollouts()
    assert sorted(r.reward for r in rollouts) == [float(i) for i in range(8)]
    for r in rollouts:
        names = [s.name for s in tracer.store.spans(r.rollout_id) if s.kind == "llm"]
        assert names == [f"c{j}" for j in range(20)]


def test_attach_to_existing_rollout(tracer: agl.Tracer) -> None:
    ro = tracer.store.start_rollout({"q": 1}, mode="val", metadata={"step": 3})
    with tracer.rollout(rollout_id=ro.rollout_id) as handle:
        with tracer.span("llm", "chat"):
            pass
        handle.reward(0.5)
    got = tracer.store.get_rollout(ro.rollout_id)
    owner = {"pid": os.getpid(), "host": socket.gethostname()}  # every rollout records its process
    assert (got.mode, got.status, got.reward, got.metadata) == (
        "val",
        "succeeded",
        0.5,
        {"step": 3, "agl.owner": owner},
    )
    assert len(tracer.store.rollouts()) == 1


def test_store_filters_and_errors(store: agl.Store) -> None:
    a = store.start_rollout("a", mode="train")
    b = store.start_rollout("b", mode="val")
    store.finish_rollout(a.rollout_id, status="failed", error="boom")
    assert [r.rollout_id for r in store.rollouts(mode="train")] == [a.rollout_id]
    assert [r.rollout_id for r in store.rollouts(status="running")] == [b.rollout_id]
    assert [r.rollout_id for r in store.rollouts(mode="train", status="failed")] == [a.rollout_id]
    assert store.get_rollout("nope") is None
    assert store.spans("nope") == []
    with pytest.raises(KeyError):
        store.finish_rollout("nope")
    with pytest.raises(ValueError, match="mode"):
        store.start_rollout("x", mode="bogus")
    with pytest.raises(ValueError, match="status"):
        store.finish_rollout(b.rollout_id, status="running")
    with pytest.raises(ValueError, match="exists already"):
        store.start_rollout("dup", rollout_id=a.rollout_id)


def test_span_upsert_replaces_in_place(store: agl.Store) -> None:
    ro = store.start_rollout("t")
    s1 = agl.Span(span_id="a", rollout_id=ro.rollout_id, kind="llm", name="first", start_time=1.0)
    s2 = agl.Span(span_id="b", rollout_id=ro.rollout_id, kind="tool", name="second", start_time=1.0)
    store.add_spans([s1, s2])
    store.add_span(s1.model_copy(update={"attributes": {"joined": True}}))
    got = store.spans(ro.rollout_id)
    assert [(s.span_id, s.attributes) for s in got] == [("a", {"joined": True}), ("b", {})]


def test_circular_and_hostile_payloads_never_crash(tracer: agl.Tracer) -> None:
    class BadRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr for you")

    loop: dict = {"name": "loop"}
    loop["self"] = loop
    with tracer.rollout("t") as ro:
        with tracer.span("tool", "t", input=loop) as sp:
            sp.set_output(BadRepr())
    (span,) = tracer.store.spans(ro.id)
    depth, node = 0, span.input
    while isinstance(node, dict) and "self" in node:  # cut off at a bounded depth, readable all the way
        assert node["name"] == "loop"
        node, depth = node["self"], depth + 1
    assert 10 < depth < 100 and node["__type__"] == "builtins.dict"
    assert span.output["__repr__"].startswith("<unrepresentable: RuntimeError('no repr for you')")
