"""Transitions, credit assignment and AIR, with hand-computed expected rewards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite import air, credit
from agentlightning_lite.transitions import rollout_transitions


def tool_call(call_id: str, name: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}],
    }


def sql_episode(tracer: agl.Tracer, final: float | None = 1.0) -> str:
    """writer -> sql tool (fails) -> checker -> +0.2 reward -> rewriter; a judge on another model."""
    with tracer.rollout({"question": "How many singers?"}, mode="train") as ro:
        with tracer.span(
            "llm", "chat", agent="writer", model="policy", input=[{"role": "user", "content": "q"}]
        ) as sp:
            sp.set_output(tool_call("c1", "run_sql"))
            sp.set_tokens([10, 11], [12, 13, 14], [-0.1, -0.2, -0.3])
        with tracer.span("tool", "run_sql", agent="writer", attributes={"tool_call_id": "c1"}) as t:
            t.set_error("OperationalError: no such column")
        with tracer.span("llm", "chat", agent="checker", model="policy", input="check it") as sp:
            sp.set_output("The query is wrong")
            sp.set_tokens([20], [21], [-1.0])
        agl.emit_reward(0.2, name="checker_found_bug")
        with tracer.span("llm", "judge", agent="judge", model="gpt-judge", input="grade") as sp:
            sp.set_output("ok")
        with tracer.span("llm", "chat", agent="rewriter", model="policy", input="rewrite") as sp:
            sp.set_output("SELECT count(*) FROM singer")
            sp.set_tokens([30, 31], [32], [-0.5])
        if final is not None:
            ro.reward(final)
    return ro.id


def test_one_transition_per_policy_call_in_order(tracer: agl.Tracer) -> None:
    rid = sql_episode(tracer)
    ts = agl.transitions(tracer.store, models=["policy"])
    assert [(t.index, t.agent) for t in ts] == [(0, "writer"), (1, "checker"), (2, "rewriter")]
    assert all(t.rollout_id == rid and t.final_reward == 1.0 and t.reward == 1.0 for t in ts)
    assert ts[0].prompt == [{"role": "user", "content": "q"}]
    assert ts[0].response == tool_call("c1", "run_sql")
    assert (ts[0].prompt_token_ids, ts[0].response_token_ids, ts[0].response_logprobs) == (
        [10, 11],
        [12, 13, 14],
        [-0.1, -0.2, -0.3],
    )
    assert ts[2].response == "SELECT count(*) FROM singer"
    # without a model filter the judge's call counts too
    assert [t.agent for t in agl.transitions(tracer.store)] == ["writer", "checker", "judge", "rewriter"]


def test_agent_selection_keeps_only_trained_agents(tracer: agl.Tracer) -> None:
    sql_episode(tracer)
    ts = agl.transitions(tracer.store, agents=["writer", "rewriter"], models=["policy"])
    assert [(t.index, t.agent) for t in ts] == [(0, "writer"), (2, "rewriter")]


def test_discounted_credit_with_air_hand_computed(tracer: agl.Tracer) -> None:
    sql_episode(tracer)
    ts = agl.transitions(
        tracer.store,
        models=["policy"],
        credit=credit.Discounted(0.9),
        air=[air.ToolStatus(success=0.1, error=-0.5)],
    )
    # intermediate: writer -0.5 (its SQL tool failed), checker +0.2 (emitted), rewriter 0; final 1.0
    # G2 = 1.0; G1 = 0.2 + 0.9 * 1.0 = 1.1; G0 = -0.5 + 0.9 * 1.1 = 0.49
    assert [t.reward for t in ts] == pytest.approx([0.49, 1.1, 1.0])
    assert ts[0].metadata["intermediate_rewards"] == [("tool_error:run_sql", -0.5)]
    assert ts[1].metadata["intermediate_rewards"] == [("checker_found_bug", 0.2)]
    # selection is applied after credit over the whole episode
    sel = agl.transitions(
        tracer.store,
        models=["policy"],
        agents=["writer"],
        credit=credit.Discounted(0.9),
        air=[air.ToolStatus(success=0.1, error=-0.5)],
    )
    assert [t.reward for t in sel] == pytest.approx([0.49])


def test_final_reward_credit_variants(tracer: agl.Tracer) -> None:
    sql_episode(tracer)
    assert [t.reward for t in agl.transitions(tracer.store, models=["policy"])] == [1.0, 1.0, 1.0]
    ts = agl.transitions(tracer.store, models=["policy"], credit=credit.FinalReward(add_intermediate=True))
    assert [t.reward for t in ts] == pytest.approx([1.0, 1.2, 1.0])


def test_no_final_reward(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        with tracer.span("llm", "a"):
            pass
        with tracer.span("llm", "b"):
            pass
    assert tracer.store.get_rollout(ro.id).reward is None
    assert [t.reward for t in agl.transitions(tracer.store)] == [None, None]
    assert [t.reward for t in agl.transitions(tracer.store, credit=credit.Discounted(0.5))] == [0.0, 0.0]


def test_discounted_gamma_one_sums_future_rewards(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        for r in (0.1, 0.2, 0.3):
            with tracer.span("llm", "c"):
                pass
            agl.emit_reward(r)
        ro.reward(2.0)
    ts = agl.transitions(tracer.store, credit=credit.Discounted(1.0))
    assert [t.reward for t in ts] == pytest.approx([2.6, 2.5, 2.3])
    with pytest.raises(ValueError, match="gamma"):
        credit.Discounted(1.5)


def test_tool_status_attribution_by_tool_call_id_and_order(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        with tracer.span("llm", "first") as sp:
            sp.set_output(tool_call("A", "search"))
        with tracer.span("llm", "second") as sp:
            sp.set_output(tool_call("B", "calc"))
        with tracer.span("tool", "search", attributes={"tool_call_id": "A"}):
            pass  # succeeds; requested by the first call although the second came later
        with tracer.span("tool", "calc"):  # no id: the last call that ended before it
            pass
        with tracer.span("tool", "calc") as t:
            t.set_error("ValueError: bad expression")
        ro.reward(0.0)
    rule = air.ToolStatus(success=1.0, error=-1.0)
    ts = agl.transitions(tracer.store, credit=credit.Discounted(0.0), air=[rule])
    assert [t.reward for t in ts] == pytest.approx([1.0, 0.0])  # second: +1 - 1
    only_search = air.ToolStatus(success=1.0, error=-1.0, tools=("calc",))
    ts = agl.transitions(tracer.store, credit=credit.Discounted(0.0), air=[only_search])
    assert [t.reward for t in ts] == pytest.approx([0.0, 0.0])


def test_rule_with_callable_reward_and_signal(tracer: agl.Tracer) -> None:
    with tracer.rollout("t") as ro:
        with tracer.span("llm", "c0"):
            pass
        agl.emit_signal("rows_returned", value=3)
        with tracer.span("llm", "c1"):
            agl.emit_signal("rows_returned", value=0)  # inside c1's subtree: belongs to c1
        ro.reward(1.0)
    rule = air.Rule(lambda s: s.name == "rows_returned", lambda s: 0.1 if s.output else -0.1, name="rows")
    ts = agl.transitions(tracer.store, credit=credit.Discounted(0.5), air=[rule])
    # c1: -0.1 + 1.0 = 0.9; c0: 0.1 + 0.5 * 0.9 = 0.55
    assert [t.reward for t in ts] == pytest.approx([0.55, 0.9])
    bad = air.Rule(lambda s: s.kind == "signal", float("nan"))
    with pytest.raises(ValueError, match="finite"):
        agl.transitions(tracer.store, air=[bad])


def test_custom_callable_credit(tracer: agl.Tracer) -> None:
    sql_episode(tracer)

    def linear(steps, final):  # later calls get more credit
        return [final * (s.index + 1) / len(steps) for s in steps]

    ts = agl.transitions(tracer.store, models=["policy"], credit=linear)
    assert [t.reward for t in ts] == pytest.approx([1 / 3, 2 / 3, 1.0])
    with pytest.raises(ValueError, match="returned 1 rewards for 3 calls"):
        agl.transitions(tracer.store, models=["policy"], credit=lambda steps, final: [0.0])


def test_require_tokens_skips_with_warning(tracer: agl.Tracer) -> None:
    sql_episode(tracer)
    with pytest.warns(RuntimeWarning, match="1 of 4 policy calls have no token ids"):
        ts = agl.transitions(tracer.store, require_tokens=True)
    assert [t.agent for t in ts] == ["writer", "checker", "rewriter"]


def test_failed_rollouts_and_filters(tracer: agl.Tracer) -> None:
    good = sql_episode(tracer)
    with pytest.raises(RuntimeError):
        with tracer.rollout("crash", mode="val"):
            with tracer.span("llm", "c"):
                pass
            raise RuntimeError("agent crashed")
    ts = agl.transitions(tracer.store, mode="val")
    assert len(ts) == 1 and ts[0].metadata["rollout_status"] == "failed" and ts[0].reward is None
    assert {t.rollout_id for t in agl.transitions(tracer.store, rollout_ids=[good])} == {good}
    with pytest.raises(KeyError):
        agl.transitions(tracer.store, rollout_ids=["missing"])


def test_export_sft(tracer: agl.Tracer, tmp_path: Path) -> None:
    sql_episode(tracer, final=1.0)
    sql_episode(tracer, final=0.0)
    out = tmp_path / "sft" / "data.jsonl"
    n = agl.export_sft(tracer.store, out, min_reward=0.5, agents=["rewriter", "writer"])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert n == len(lines) == 2
    assert lines[0]["messages"] == [{"role": "user", "content": "q"}, tool_call("c1", "run_sql")]
    assert lines[1]["messages"] == [
        {"role": "user", "content": "rewrite"},
        {"role": "assistant", "content": "SELECT count(*) FROM singer"},
    ]
    assert {x["reward"] for x in lines} == {1.0}
    assert agl.export_sft(tracer.store, out) == 8  # everything, including the 0-reward episode


def test_air_takes_a_single_rule_as_well_as_a_list(tracer: agl.Tracer) -> None:
    sql_episode(tracer)
    rule = air.ToolStatus(success=0.1, error=-0.5)
    kw: dict = dict(models=["policy"], credit=credit.Discounted(0.9))
    single = agl.transitions(tracer.store, air=rule, **kw)
    listed = agl.transitions(tracer.store, air=[rule], **kw)
    assert [t.reward for t in single] == [t.reward for t in listed] == pytest.approx([0.49, 1.1, 1.0])
    assert single[0].metadata["intermediate_rewards"] == [("tool_error:run_sql", -0.5)]
    ro = tracer.store.rollouts()[0]
    one = rollout_transitions(ro, tracer.store.spans(ro.rollout_id), air=rule, **kw)
    assert [t.reward for t in one] == pytest.approx([0.49, 1.1, 1.0])
    assert air.as_rules(r for r in [rule]) == [rule] and air.as_rules(None) is None
    with pytest.raises(TypeError, match="air= rule 1 is a float"):
        agl.transitions(tracer.store, air=[rule, 0.5], **kw)
    with pytest.raises(TypeError, match="air= takes a rule or a list of rules, got int"):
        agl.transitions(tracer.store, air=3, **kw)
