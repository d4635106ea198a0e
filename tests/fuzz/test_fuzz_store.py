"""Fuzz the stores' public methods: any task, any reward, any span content. Accepted values read back
the same from MemoryStore and SQLiteStore; refused ones raise a clear error and write nothing."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentlightning_lite as agl

from .strategies import hostile_text, json_values, numbers


class Weird:
    def __repr__(self) -> str:
        return "<Weird>"


tasks = st.one_of(
    json_values,
    st.builds(Weird),
    st.sets(st.integers(), max_size=3),
    st.binary(max_size=20),
    st.tuples(st.integers(), hostile_text),
    st.just(float("nan")),
    st.just({"nested": {"inf": float("inf")}}),
)


def _stores(tmp: Path) -> list[agl.Store]:
    return [agl.MemoryStore(), agl.SQLiteStore(tmp / "runs.db")]


@given(task=tasks, metadata=st.dictionaries(hostile_text, json_values, max_size=3))
def test_any_task_round_trips_alike(task: Any, metadata: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        mem, sql = _stores(Path(tmp))
        got = []
        for store in (mem, sql):
            try:
                ro = store.start_rollout(task, mode="train", metadata=metadata)
            except (TypeError, ValueError) as exc:
                assert str(exc)  # a clear message
                assert store.rollouts() == []  # nothing written half-way
                got.append(None)
                continue
            got.append(store.get_rollout(ro.rollout_id))
        sql.close()
        reopened = agl.SQLiteStore(Path(tmp) / "runs.db")
        assert [r.task for r in reopened.rollouts()] == ([got[1].task] if got[1] is not None else [])
        reopened.close()
        assert (got[0] is None) == (got[1] is None)
        if got[0] is not None:
            assert got[0].task == got[1].task or _nan_equal(got[0].task, got[1].task)
            assert got[0].metadata == got[1].metadata or _nan_equal(got[0].metadata, got[1].metadata)


def _nan_equal(a: Any, b: Any) -> bool:
    return repr(a) == repr(b) or (isinstance(a, float) and math.isnan(a) and math.isnan(b))


@given(reward=st.one_of(numbers, hostile_text, st.booleans(), st.none(), json_values))
def test_rewards_finite_numbers_or_refused(reward: Any) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for store in _stores(Path(tmp)):
            ro = store.start_rollout("t")
            ok = reward is None or (isinstance(reward, (int, float)) and math.isfinite(reward))  # bools too
            if ok:
                done = store.finish_rollout(ro.rollout_id, status="succeeded", reward=reward)
                assert done.reward == (None if reward is None else float(reward))
            else:
                with pytest.raises(ValueError, match="reward"):
                    store.finish_rollout(ro.rollout_id, status="succeeded", reward=reward)
                with pytest.raises(ValueError, match="reward"):
                    store.set_reward(ro.rollout_id, reward)
                after = store.get_rollout(ro.rollout_id)
                assert after is not None and after.status == "running" and after.reward is None
            store.close()


span_fields = st.fixed_dictionaries(
    {},
    optional={
        "kind": st.sampled_from(["llm", "tool", "agent", "chain", "reward", "signal", "custom", "bogus"]),
        "name": hostile_text,
        "agent": st.one_of(st.none(), hostile_text),
        "input": st.one_of(json_values, st.builds(Weird), st.just("€" * 200_000)),
        "output": st.one_of(json_values, st.binary(max_size=10)),
        "attributes": st.dictionaries(hostile_text, st.one_of(json_values, st.builds(Weird)), max_size=4),
        "status": st.sampled_from(["ok", "error", "weird"]),
        "start_time": numbers,
        "end_time": st.one_of(st.none(), numbers),
        "prompt_token_ids": st.one_of(st.none(), st.lists(st.integers(-5, 2**40), max_size=5)),
        "response_logprobs": st.one_of(st.none(), st.lists(numbers, max_size=4)),
    },
)


@given(fields=span_fields)
def test_spans_stored_alike_or_refused(fields: dict[str, Any]) -> None:
    fields.setdefault("start_time", 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        mem, sql = _stores(Path(tmp))
        results = []
        for store in (mem, sql):
            ro = store.start_rollout("t")
            try:
                span = agl.Span(span_id="s1", rollout_id=ro.rollout_id, **fields)
            except (ValueError, TypeError) as exc:  # pydantic's ValidationError is a ValueError
                assert str(exc)
                results.append("refused")
                continue
            store.add_spans([span])
            results.append(store.spans(ro.rollout_id))
        sql.close()
        assert (results[0] == "refused") == (results[1] == "refused")
        if results[0] != "refused":
            a, b = results[0][0], results[1][0]
            assert _same(a, b)
            reopened = agl.SQLiteStore(Path(tmp) / "runs.db")
            (rid,) = [r.rollout_id for r in reopened.rollouts()]
            assert _same(reopened.spans(rid)[0], b)
            reopened.close()


def _same(a: agl.Span, b: agl.Span) -> bool:
    """Equal but for the rollout id; the SQLite store writes text outside UTF-8 escaped (\\uXXXX)."""
    return repr(_norm(a.model_dump(exclude={"rollout_id"}))) == repr(
        _norm(b.model_dump(exclude={"rollout_id"}))
    )


def _norm(v: Any) -> Any:
    from agentlightning_lite._json import utf8_safe

    if isinstance(v, str):
        return utf8_safe(v)
    if isinstance(v, dict):
        return {_norm(k): _norm(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_norm(x) for x in v]
    return v
