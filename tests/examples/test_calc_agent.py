"""The example calc agent: safe calculator, tool spans, reward, against a real PolicyServer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from calc_agent import calc_agent, calculate, make_tasks


def test_calculator_is_arithmetic_only() -> None:
    assert calculate("2 + 3 * 4") == 14
    assert calculate("-(7 - 10) / 2") == 1.5
    for bad in ("__import__('os').system('true')", "open('x')", "2 ** 10", "a + 1"):
        with pytest.raises(ValueError):
            calculate(bad)


def test_tasks_are_reproducible() -> None:
    assert make_tasks(5, seed=3) == make_tasks(5, seed=3)
    assert all(t["answer"] == sum(map(int, t["question"][8:-1].split(" + "))) for t in make_tasks(20, 1))


@pytest.mark.parametrize(
    ("replies", "reward", "tool_status"),
    [
        (["<calc>23 + 58", "81"], 1.0, "ok"),  # the server stops at </calc>; the agent runs the tool
        (["<calc>23 +", "80"], 0.0, "error"),  # a malformed expression is a failed tool call
        (["The answer is 81."], 1.0, None),  # no tool: answered directly
    ],
)
def test_calc_agent_episode(replies: list[str], reward: float, tool_status: str | None) -> None:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(replies, tokenizer="bytes"), store) as server:
        with tracer.rollout({"q": 1}) as ro:
            got = calc_agent({"question": "What is 23 + 58?", "answer": 81}, server.llm(ro.id))
            ro.reward(got)
    assert got == reward
    spans = store.spans(ro.id)
    tools = [s for s in spans if s.kind == "tool"]
    assert [s.status for s in tools] == ([tool_status] if tool_status else [])
    ts = agl.transitions(
        store, air=[agl.air.ToolStatus(success=0.1, error=-0.1)], credit=agl.credit.Discounted(1.0)
    )
    assert len(ts) == len(replies) and all(t.response_token_ids for t in ts)
    if tool_status == "ok":
        assert tools[0].output == "81"
        assert [round(t.reward, 3) for t in ts] == [1.1, 1.0]  # AIR credits the call that asked for the tool
