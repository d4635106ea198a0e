"""The tracer's fast write path records exactly what the general one does: rollouts the tracer starts
(kept as rows until read), payload copies and JSON text made without a JSON round trip, and SQLite
span rows bound as they are (escaped only when UTF-8 cannot hold their text)."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite._json import dumps, jsonable_copy

_REFERENCE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode


class _Color(enum.Enum):
    RED = 1


class _Level(enum.IntEnum):
    HIGH = 2


class _Text(str):
    pass


@dataclasses.dataclass
class _Point:
    x: int = 1


PLAIN: list[Any] = [
    {"messages": [{"role": "user", "content": "hi é \U0001f600"}], "n": 3, "t": 0.1, "ok": True, "no": None},
    [1, 2.5, -0.0, 1e16, 1e-7, 2**100, "x", [], {}],
    ("a", ("b", 1)),
    {"deep": [[[[{"k": [1]}]]]]},
]
NOT_PLAIN: list[Any] = [
    {1: "int key", 2.5: "float key", None: "none key"},
    {False: "bool key"},
    {"nan": math.nan, "inf": [math.inf]},
    {"enum": _Color.RED, "int enum": _Level.HIGH, "str subclass": _Text("s")},
    {"set": {3, 1, 2}, "bytes": b"\xff\x00", "dataclass": _Point()},
    [{"a": "surrogate \ud800"}],
]


@pytest.mark.parametrize("value", PLAIN)
def test_plain_data_copies_and_encodes_as_the_json_codec_does(value: Any) -> None:
    text = _REFERENCE(value)
    assert dumps(value) == text
    copy = jsonable_copy(value)
    assert copy == json.loads(text) and repr(copy) == repr(json.loads(text))
    if isinstance(value, (dict, list)) and value:
        assert copy is not value


@pytest.mark.parametrize("value", NOT_PLAIN)
def test_other_data_copies_as_its_json_text_reads_back(value: Any) -> None:
    copy = jsonable_copy(value)
    assert copy == json.loads(dumps(value))
    assert json.loads(json.dumps(copy)) == copy  # JSON-safe


def test_scalars_encode_as_the_json_codec_does() -> None:
    for v in (0, -5, 2**70, 0.1, -0.0, 1e300, True, False, None, 'q"\n', _Level.HIGH):
        assert dumps(v) == _REFERENCE(v), v
    assert dumps(math.nan) == '"nan"' and dumps(-math.inf) == '"-inf"'


def _same_rollout(a: agl.Rollout, b: agl.Rollout) -> None:
    skip = {"rollout_id", "start_time", "end_time"}
    assert a.model_dump(exclude=skip) == b.model_dump(exclude=skip)
    assert a.model_fields_set == b.model_fields_set
    assert (a.end_time is None) == (b.end_time is None)


@pytest.mark.parametrize("task", [{"q": (1, 2), 5: {"x"}}, "plain text", None, [math.nan]])
@pytest.mark.parametrize("metadata", [None, {"step": 3, "agl.owner": {"pid": 1, "host": "h"}}])
def test_tracer_rollouts_read_back_as_store_rollouts_do(store: agl.Store, task: Any, metadata: Any) -> None:
    tracer = agl.Tracer(store)
    with tracer.rollout(task, mode="train", metadata=metadata) as ro:
        running = store.get_rollout(ro.id)
        ro.reward(0.5)
    ref = store.start_rollout(task, mode="train", metadata=metadata).rollout_id
    ref_running = store.get_rollout(ref)
    assert running is not None and ref_running is not None
    _same_rollout(running, ref_running)
    store.finish_rollout(ref, status="succeeded", reward=0.5, error=None)
    done, ref_done = store.get_rollout(ro.id), store.get_rollout(ref)
    assert done is not None and ref_done is not None
    assert done.status == "succeeded" and done.reward == 0.5
    _same_rollout(done, ref_done)
    assert [r.rollout_id for r in store.rollouts(mode="train")] == [ro.id, ref]


def test_a_failed_rollout_and_a_timed_out_one(store: agl.Store) -> None:
    tracer = agl.Tracer(store)
    with pytest.raises(RuntimeError), tracer.rollout("t") as ro:
        raise RuntimeError("boom")
    failed = store.get_rollout(ro.id)
    assert failed is not None and (failed.status, failed.error) == ("failed", "RuntimeError: boom")
    ref = store.start_rollout("t")
    with tracer.rollout(rollout_id=ref.rollout_id) as attached:  # a trainer's rollout, run here
        store.finish_rollout(attached.id, status="timeout")  # the trainer gave up on it
    timed_out = store.get_rollout(ref.rollout_id)
    assert timed_out is not None and timed_out.status == "timeout"  # the agent's exit left it so


def test_a_store_that_overrides_a_rollout_method_is_called_by_the_tracer() -> None:
    class Counting(agl.MemoryStore):
        def __init__(self) -> None:
            super().__init__()
            self.started: list[str] = []
            self.finished: list[str] = []

        def start_rollout(self, *args: Any, **kwargs: Any) -> agl.Rollout:
            ro = super().start_rollout(*args, **kwargs)
            self.started.append(ro.rollout_id)
            return ro

        def finish_rollout(self, rollout_id: str, *args: Any, **kwargs: Any) -> agl.Rollout:
            self.finished.append(rollout_id)
            return super().finish_rollout(rollout_id, *args, **kwargs)

    store = Counting()
    with agl.Tracer(store).rollout("t") as ro:
        pass
    assert store.started == store.finished == [ro.id]


def test_sqlite_text_utf8_cannot_hold_is_stored_escaped_with_its_batch(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with agl.SQLiteStore(path, flush_interval=0) as store:
        tracer = agl.Tracer(store)
        with tracer.rollout("t") as ro:
            with tracer.span("tool", "before"):
                pass
            with tracer.span("tool", "bad \ud800 name", input={"q": "x \udfff"}) as sp:
                sp.set_output("ok")
            with tracer.span("tool", "after"):
                pass
    spans = agl.SQLiteStore(path).spans(ro.id)
    assert [s.name for s in spans] == ["before", "bad \\ud800 name", "after"]
    assert spans[1].input == {"q": "x \udfff"} and spans[1].output == "ok"


def test_sqlite_token_blobs_are_little_endian(tmp_path: Path) -> None:
    path = tmp_path / "runs.db"
    with agl.SQLiteStore(path) as store:
        tracer = agl.Tracer(store)
        with tracer.rollout("t") as ro, tracer.span("llm", "chat") as sp:
            sp.set_tokens([1, 2**31 - 1], [3], [-0.5])
        [blobs] = store.query("SELECT prompt_token_ids, response_token_ids, response_logprobs FROM spans")
    assert blobs == (
        (1).to_bytes(4, "little") + (2**31 - 1).to_bytes(4, "little"),
        (3).to_bytes(4, "little"),
        bytes.fromhex("000000000000e0bf"),  # -0.5 as a little-endian float64
    )
    [span] = agl.SQLiteStore(path).spans(ro.id)
    tokens = (span.prompt_token_ids, span.response_token_ids, span.response_logprobs)
    assert tokens == ([1, 2**31 - 1], [3], [-0.5])
