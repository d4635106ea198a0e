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


# -- the span write path: what the tracer's episodes store, against the general path -----------------


def _episode(tracer: agl.Tracer, i: int) -> str:
    """An agent episode of every kind of span the tracer writes itself (as the tracing benchmark's)."""
    prompt = [{"role": "user", "content": f"q{i} é"}]
    with tracer.rollout({"i": i}, mode="train") as ro:
        with tracer.span("agent", "solver", agent="solver"):
            with tracer.span("llm", "chat", input=prompt, model="policy") as sp:
                sp.set_output({"role": "assistant", "content": None, "n": (i, 2.5)})
                sp.set_tokens(list(range(i, i + 64)), [0, 2**31 - 1, i], [-0.25, -1e-300, 0.0])
            with tracer.span("tool", "calc", input={"expr": "1+1"}, attributes={"k": [1]}) as t:
                t.set_output(i)
                t.set_attribute("extra", {"x": None})
            agl.emit_signal("checked", value=i, status="ok", note="n")
        agl.emit_reward(0.5)
    return ro.id


def _as_general_path(spans: list[agl.Span]) -> list[agl.Span]:
    """The same spans through ``add_spans`` (Span objects, validated and copied) into a fresh store."""
    ref = agl.MemoryStore()
    ids = {}
    for s in spans:
        if s.rollout_id not in ids:
            ids[s.rollout_id] = ref.start_rollout(mode="train").rollout_id
    ref.add_spans([s.model_copy(update={"rollout_id": ids[s.rollout_id]}) for s in spans])
    out: list[agl.Span] = []
    for rid in dict.fromkeys(ids.values()):
        out.extend(ref.spans(rid))
    return out


def _dump(spans: list[agl.Span]) -> list[dict[str, Any]]:
    return [s.model_dump(exclude={"rollout_id"}) for s in spans]


def _shape(spans: list[agl.Span]) -> list[dict[str, Any]]:
    """What two runs of the same episodes share: everything but ids and times (parents by position)."""
    pos = {s.span_id: i for i, s in enumerate(spans)}
    return [
        {
            **s.model_dump(exclude={"rollout_id", "span_id", "start_time", "end_time"}),
            "parent_id": pos.get(s.parent_id),
        }
        for s in spans
    ]


def test_tracer_spans_are_stored_as_the_general_path_stores_them(store: agl.Store) -> None:
    tracer = agl.Tracer(store)
    ids = [_episode(tracer, i) for i in range(40)]  # many rows pending and filed, many SQLite statements
    spans = [s for rid in ids for s in store.spans(rid)]
    assert len(spans) == 40 * 5
    assert _dump(spans) == _dump(_as_general_path(spans))
    first = store.spans(ids[0])
    assert [(s.kind, s.name, s.agent) for s in first] == [
        ("agent", "solver", "solver"),
        ("llm", "chat", "solver"),
        ("tool", "calc", "solver"),
        ("signal", "checked", "solver"),
        ("reward", "reward", None),
    ]
    # the last emitted reward, rewritten in place as the final one when the rollout ended
    assert first[4].attributes == {"reward": 0.5, "final": True} and first[4].output == 0.5
    llm = first[1]
    assert llm.input == [{"role": "user", "content": "q0 é"}]
    assert llm.output == {"role": "assistant", "content": None, "n": [0, 2.5]}
    assert llm.prompt_token_ids == list(range(64))
    assert (llm.response_token_ids, llm.response_logprobs) == ([0, 2**31 - 1, 0], [-0.25, -1e-300, 0.0])
    assert first[2].attributes == {"k": [1], "extra": {"x": None}} and first[2].output == 0
    assert store.get_rollout(ids[-1]).reward == 0.5  # type: ignore[union-attr]


def test_memory_and_sqlite_store_the_same_spans(tmp_path: Path) -> None:
    mem, path = agl.MemoryStore(), tmp_path / "runs.db"
    with agl.SQLiteStore(path, batch_size=7) as sq:  # full batches and a partial one
        by_store = []
        for store in (mem, sq):
            tracer = agl.Tracer(store)
            ids = [_episode(tracer, i) for i in range(30)]
            by_store.append([s for rid in ids for s in store.spans(rid)])
    assert _shape(by_store[0]) == _shape(by_store[1])
    with agl.SQLiteStore(path) as reread:  # and as a fresh process reads the file
        again = [s for r in reread.rollouts() for s in reread.spans(r.rollout_id)]
    assert _dump(again) == _dump(by_store[1])


def test_memory_store_files_pending_rows_before_a_rollout_ends(caplog: pytest.LogCaptureFixture) -> None:
    """Rows wait unfiled until a read or a rollout's end; each is judged as when it was written."""
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with tracer.rollout("t") as ro:
        early = tracer.start_span("tool", "early")  # started while the rollout runs
    late = tracer.start_span("tool", "late", rollout_id=ro.id)  # started after it ended
    early.end()
    late.end()
    assert len(store._pending) == 2  # nothing read or ended since: still unfiled
    with caplog.at_level("WARNING", logger="agentlightning_lite.store.base"):
        names = [s.name for s in store.spans(ro.id)]
    assert names == ["early"]
    assert "dropped span" in caplog.text and "late" in caplog.text
    other = store.open_rollout("u")
    tracer.start_span("tool", "x", rollout_id=other, span_id=early.span_id).end()  # an id of `ro`
    with caplog.at_level("WARNING", logger="agentlightning_lite.store.base"):
        store.close_rollout(other)  # files it first: refused, logged, `ro` keeps its span
    assert "refused 1 span write" in caplog.text
    assert store.spans(other) == [] and [s.name for s in store.spans(ro.id)] == ["early"]


def test_memory_store_files_rows_written_from_many_threads_in_order() -> None:
    import threading

    store = agl.MemoryStore()
    rid = store.open_rollout("t")
    tracer = agl.Tracer(store)

    def write(k: int) -> None:
        for i in range(600):  # more than the pending queue holds before it files itself
            tracer.start_span("custom", f"{k}-{i}", rollout_id=rid, start_time=float(i)).end()

    threads = [threading.Thread(target=write, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = store.spans(rid)
    assert len(spans) == 2400 and len({s.span_id for s in spans}) == 2400
    for k in range(4):
        assert [s.name for s in spans if s.name.startswith(f"{k}-")] == [f"{k}-{i}" for i in range(600)]


def test_span_ids_from_many_threads_are_unique_and_ordered_per_thread() -> None:
    import threading

    from agentlightning_lite.ids import new_rollout_id, new_span_id

    got: list[list[str]] = [[] for _ in range(4)]

    def take(k: int) -> None:
        got[k].extend(new_span_id() for _ in range(2000))

    threads = [threading.Thread(target=take, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [i for ids in got for i in ids]
    assert len(set(every)) == 8000 and all(len(i) == 20 and int(i, 16) >= 0 for i in every)
    assert all(ids == sorted(ids) for ids in got)
    rollouts = [new_rollout_id() for _ in range(3000)]  # several blocks of random suffixes
    assert len(set(rollouts)) == 3000 and len({r[12:] for r in rollouts}) == 3000


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_makes_other_ids() -> None:
    import os

    from agentlightning_lite.ids import new_rollout_id, new_span_id

    new_span_id(), new_rollout_id()  # blocks made in the parent
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, f"{new_span_id()} {new_rollout_id()}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    child_span, child_rollout = os.read(r, 100).decode().split()
    os.close(r), os.close(w)
    assert child_span[:8] != new_span_id()[:8]  # another prefix
    assert child_rollout[12:] != new_rollout_id()[12:]


def test_token_blobs_pack_as_array_does_and_refuse_what_it_refuses() -> None:
    from array import array

    from agentlightning_lite.store.sqlite_schema import floats_blob, ids_blob

    for ids in ([], [0], [2**31 - 1, -(2**31)], list(range(1000)), (5, 6)):
        assert ids_blob(ids) == array("i", ids).tobytes()
    for values in ([], [-0.5, 1e-300, -0.0, 3], (1.5,)):
        assert floats_blob(values) == array("d", values).tobytes()
    for bad in ([2**31], [1.5], ["a"], [None]):
        with pytest.raises(Exception) as ours:
            ids_blob(bad)
        with pytest.raises(Exception) as theirs:
            array("i", bad)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value))


def test_sqlite_multi_row_statements_store_what_one_upsert_a_row_stores(tmp_path: Path) -> None:
    import sqlite3

    from agentlightning_lite.store.sqlite_batch import write_spans
    from agentlightning_lite.store.sqlite_schema import SCHEMA, SPAN_UPSERT

    rows = [
        (f"s{i % 700}", f"r{i % 3 if i < 700 else 0}", None, "tool", f"n{i}", None, float(i), None, "ok",
         None, "null", str(i), "{}", None, None, None, bytes([i % 256]))
        for i in range(900)  # 200 rewrites: same rollout (replaced) or another (refused)
    ]  # fmt: skip
    dbs = []
    for name, write in (("many", write_spans), ("one", lambda c, p: c.executemany(SPAN_UPSERT, p))):
        conn = sqlite3.connect(tmp_path / f"{name}.db")
        conn.executescript(SCHEMA)
        before = conn.total_changes
        write(conn, rows)
        dbs.append((conn.total_changes - before, conn.execute("SELECT * FROM spans ORDER BY seq").fetchall()))
        conn.close()
    assert dbs[0] == dbs[1]
    assert len(dbs[0][1]) == 700 and dbs[0][0] < 900


def test_sqlite_multi_row_rollout_writes_store_what_one_statement_a_row_stores(tmp_path: Path) -> None:
    import sqlite3

    from agentlightning_lite.store.sqlite_batch import write_rollouts
    from agentlightning_lite.store.sqlite_schema import ROLLOUT_INSERT, ROLLOUT_UPDATE, SCHEMA

    inserts = [
        (f"r{i % 600}", f'{{"i":{i}}}', "train", "running", float(i), None, None, "{}", None)
        for i in range(700)  # 100 ids inserted twice: the first insert stays
    ]
    updates = [
        ("succeeded" if i % 2 else "failed", 1000.0 + i, i / 10, None if i % 2 else f"e{i}", f'{{"u":{i}}}',
         f"r{i % 450}")
        for i in range(900)  # 450 rollouts updated twice (the last stays), 150 never
    ] + [("timeout", 5.0, None, "x", "{}", "absent")]  # fmt: skip

    def one_by_one(c: sqlite3.Connection, ins: Any, upd: Any) -> None:
        c.executemany(ROLLOUT_INSERT, ins)
        c.executemany(ROLLOUT_UPDATE, upd)

    dbs = []
    for name, write in (("many", write_rollouts), ("one", one_by_one)):
        conn = sqlite3.connect(tmp_path / f"{name}.db")
        conn.executescript(SCHEMA)
        write(conn, inserts, updates)
        dbs.append(conn.execute("SELECT * FROM rollouts ORDER BY rowid").fetchall())
        conn.close()
    assert dbs[0] == dbs[1]
    assert len(dbs[0]) == 600 and {r[3] for r in dbs[0]} == {"succeeded", "failed", "running"}


def test_sqlite_flush_writes_rollouts_in_few_statements(tmp_path: Path) -> None:
    """Each statement is one release of the GIL and one wait to take it back: a flush of 100 rollouts
    is not 100 statements (the writer thread then falls behind the agents)."""
    store = agl.SQLiteStore(tmp_path / "runs.db", flush_interval=0)
    tracer = agl.Tracer(store)
    store.flush()
    statements: list[str] = []
    assert store._conn is not None
    store._conn.set_trace_callback(statements.append)
    for i in range(100):
        with tracer.rollout({"i": i}, mode="train") as ro:
            ro.reward(1.0)
    long = store.open_rollout("still running")
    store.flush()
    store.close_rollout(long, "failed", error="x")
    store.flush()
    inserts = [s for s in statements if s.startswith("INSERT INTO rollouts")]
    updates = [s for s in statements if s.startswith("UPDATE rollouts")]
    assert 1 <= len(inserts) <= 7 and len(updates) == 1, statements
    assert len(agl.SQLiteStore(tmp_path / "runs.db").rollouts(status="succeeded")) == 100
    store.close()


def test_sqlite_full_batches_are_committed_by_the_writer_thread(tmp_path: Path) -> None:
    import sqlite3
    import time

    path = tmp_path / "runs.db"
    store = agl.SQLiteStore(path, batch_size=10, flush_interval=30.0)  # the timer never fires here
    tracer = agl.Tracer(store)
    rid = store.open_rollout("t")
    for i in range(10):
        tracer.start_span("tool", f"t{i}", rollout_id=rid).end()
    reader = sqlite3.connect(path)
    deadline = time.monotonic() + 20
    while reader.execute("SELECT count(*) FROM spans").fetchone()[0] < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reader.execute("SELECT count(*) FROM spans").fetchone()[0] == 10  # no flush or read of ours
    reader.close()
    store.close()


def test_a_span_left_open_in_a_rollout_is_not_the_parent_of_spans_after_it() -> None:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with tracer.rollout("t") as ro:
        tracer.span("agent", "left open").__enter__()  # never exited
    assert agl.Tracer.current_span() is None
    with tracer.span("tool", "after") as sp:  # no rollout open: an implicit one, not `ro`
        pass
    assert sp.rollout_id != ro.id and sp.parent_id is None
    assert [s.name for s in store.spans(sp.rollout_id)] == ["after"]
