"""Fuzz credit assignment and AIR: any episode (empty, rewards only, calls only, tools with and
without a requesting call, errors) gives one finite-reward transition per policy call, in order."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import agentlightning_lite as agl

events = st.lists(
    st.one_of(
        st.tuples(st.just("llm"), st.sampled_from(["a", "b", None]), st.booleans()),
        st.tuples(st.just("tool"), st.sampled_from(["calc", "search"]), st.booleans()),
        st.tuples(st.just("reward"), st.floats(-10, 10), st.booleans()),
        st.tuples(st.just("signal"), st.sampled_from(["ok", "bad"]), st.booleans()),
    ),
    max_size=12,
)
credits = st.sampled_from(
    [agl.credit.FinalReward(), agl.credit.FinalReward(add_intermediate=True), agl.credit.Discounted(0.9),
     agl.credit.Discounted(1.0), agl.credit.Discounted(0.0)]
)  # fmt: skip
airs = st.sampled_from(
    [None, [], agl.air.ToolStatus(success=0.1, error=-0.5), [agl.air.ToolStatus(success=0.1, error=-0.5)],
     [agl.air.Rule(lambda s: s.kind == "signal" and s.name == "bad", -0.3, name="bad")]]
)  # fmt: skip


def _episode(tracer: agl.Tracer, evs: list[tuple[str, Any, bool]], final: float | None) -> tuple[str, int]:
    calls = 0
    with tracer.rollout("task", mode="train") as ro:
        for i, (kind, arg, flag) in enumerate(evs):
            if kind == "llm":
                calls += 1
                with tracer.span("llm", "chat", agent=arg, input=[{"role": "user", "content": "q"}]) as sp:
                    out: dict[str, Any] = {"role": "assistant", "content": "x"}
                    if flag:
                        out["tool_calls"] = [{"id": f"c{i}", "function": {"name": "calc", "arguments": "{}"}}]
                    sp.set_output(out)
            elif kind == "tool":
                with tracer.span("tool", arg, attributes={"tool_call_id": f"c{i - 1}"}) as t:
                    if flag:
                        t.set_error("boom")
                    else:
                        t.set_output(1)
            elif kind == "reward":
                agl.emit_reward(arg)
            else:
                agl.emit_signal(arg, status="error" if flag else "ok")
        if final is not None:
            ro.reward(final)
    return ro.id, calls


@given(evs=events, final=st.one_of(st.none(), st.floats(-5, 5)), credit=credits, air=airs,
       agents=st.sampled_from([None, ["a"], ["b", "a"], []]))  # fmt: skip
def test_one_finite_transition_per_policy_call(
    evs: list[tuple[str, Any, bool]], final: float | None, credit: Any, air: Any, agents: Any
) -> None:
    tracer = agl.Tracer()
    rid, calls = _episode(tracer, evs, final)
    items = agl.transitions(tracer.store, credit=credit, air=air)
    assert [t.index for t in items] == list(range(calls))
    assert all(t.rollout_id == rid for t in items)
    for t in items:
        assert t.reward is None or math.isfinite(t.reward)
        if final is not None and isinstance(credit, agl.credit.FinalReward) and not credit.add_intermediate:
            assert t.reward == final
    kept = agl.transitions(tracer.store, credit=credit, air=air, agents=agents)
    want = [e for e in evs if e[0] == "llm" and (agents is None or e[1] in agents)]
    assert len(kept) == len(want)
