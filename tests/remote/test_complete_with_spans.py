"""A result that carries its rollout's last span rows: one request, one lease check, every span kept.

``POST /agl/v1/rollouts/{id}/complete`` with ``"rows"`` writes the rows before the outcome is
counted; ``RemoteStore.finish_rollout`` sends the rollout's buffered rows that way instead of
flushing the whole buffer first. Against a real server on 127.0.0.1.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import RemoteError, RemoteStore, RunnerClient
from agentlightning_lite.store.rows import span_to_row
from agentlightning_lite.types import Rollout

KEY = "k"
AUTH = {"authorization": f"Bearer {KEY}"}


def _spans(rid: str, n: int) -> list[agl.Span]:
    """``n`` spans of ``rid``: LLM calls with token ids and logprobs, tools with JSON input."""
    out = []
    for i in range(n):
        llm = i % 2 == 0
        out.append(
            agl.Span(
                span_id=f"{rid}:{i}",
                rollout_id=rid,
                parent_id=None if i == 0 else f"{rid}:0",
                kind="llm" if llm else "tool",
                name="chat" if llm else "calc",
                agent="solver",
                start_time=1.7e9 + i,
                end_time=1.7e9 + i + 0.5,
                status="ok" if i != 3 else "error",
                error=None if i != 3 else "ZeroDivisionError",
                input=[{"role": "user", "content": f"q{i}"}] if llm else {"expr": f"{i}*7"},
                output=f"a{i}",
                attributes={"i": i},
                model="policy" if llm else None,
                prompt_token_ids=[1, 2, i] if llm else None,
                response_token_ids=[3, i] if llm else None,
                response_logprobs=[-0.5, -0.25] if llm else None,
            )
        )
    return out


def _wire(spans: list[agl.Span]) -> list[list[Any]]:
    return [list(span_to_row(s)) for s in spans]


def _claim(runners: agl.RemoteRunners, n: int = 1, **kw: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    assert runners.queue is not None
    jobs = runners.queue.submit([(f"t{i}", "train", {}) for i in range(n)])
    with RunnerClient(runners.url, api_key=KEY) as client:
        claims = [client.claim(f"w{i}", wait=1.0) for i in range(n)]
    assert all(c is not None for c in claims)
    return jobs, claims  # type: ignore[return-value]


def _complete(http: httpx.Client, rid: str, lease: str | None, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-agl-lease": lease} if lease else {}
    return http.post(f"/agl/v1/rollouts/{rid}/complete", json=body, headers=headers)


def _no_weights_version(s: agl.Span) -> dict[str, Any]:
    d = s.model_dump()
    d["attributes"].pop("weights_version")
    return d


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_spans_sent_only_with_the_result_are_all_stored(
    served: Callable[..., agl.RemoteRunners], tmp_path: Path, kind: str
) -> None:
    store = agl.SQLiteStore(tmp_path / "s.db") if kind == "sqlite" else agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job], [claimed] = _claim(runners)
    rid = claimed["rollout_id"]
    client = RunnerClient(runners.url, api_key=KEY)
    remote = RemoteStore(client, flush_interval=3600.0)  # the flusher never sends on its own
    remote.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), claimed["lease"])
    spans = _spans(rid, 6)
    remote.add_spans(spans)
    remote.finish_rollout(rid, "succeeded", reward=0.75)
    answer = remote.last_result[rid]
    assert answer == {"counted": True, "status": "succeeded", "accepted": 6}
    assert remote.dropped == 0 and remote._rows == []
    assert (job.status, job.reward) == ("succeeded", 0.75)
    ro = store.get_rollout(rid)
    assert (ro.status, ro.reward) == ("succeeded", 0.75)
    stored = store.spans(rid)
    assert [_no_weights_version(s) for s in stored] == [s.model_dump() for s in spans]
    assert {s.attributes["weights_version"] for s in stored} == {claimed["weights_version"]}
    # a rollout the runner started itself (trace mode, no lease) takes its spans the same way
    with agl.Tracer(remote).rollout("trace me") as ro2:
        agl.emit_reward(1.0)
    # two rows of one span id: the reward, then its final version (the store keeps the last)
    assert remote.last_result[ro2.id]["accepted"] == 2
    [reward] = store.spans(ro2.id)
    assert (reward.kind, reward.output, reward.attributes["final"]) == ("reward", 1.0, True)
    assert store.get_rollout(ro2.id).status == "succeeded"
    remote.close()
    client.close()


def test_many_workers_lose_no_span_while_batches_are_in_flight(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None
    n, per = 80, 6
    jobs = runners.queue.submit([(i, "train", {}) for i in range(n)])
    client = RunnerClient(runners.url, api_key=KEY)
    remote = RemoteStore(client, batch_size=8, flush_interval=0.001)  # batches fly all the time
    done: list[str] = []
    lock = threading.Lock()

    def work(wid: str) -> None:
        while True:
            claimed = client.claim(wid, wait=0.2)
            if claimed is None:
                return
            rid = claimed["rollout_id"]
            remote.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), claimed["lease"])
            for s in _spans(rid, per):  # one at a time: the flusher takes some of them
                remote.add_spans([s])
            remote.finish_rollout(rid, "succeeded", reward=1.0)
            with lock:
                done.append(rid)

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(done) == n and remote.dropped == 0
    assert all(j.status == "succeeded" and j.reward == 1.0 for j in jobs)
    assert all(len(store.spans(rid)) == per for rid in done)
    assert sum(remote.last_result[rid].get("accepted", 0) for rid in done) <= n * per
    remote.close()
    client.close()


class _HeldClient(RunnerClient):
    """A client whose span batches wait at the door until ``go`` is set (a slow network)."""

    def __init__(self, url: str) -> None:
        super().__init__(url, api_key=KEY)
        self.sending, self.go = threading.Event(), threading.Event()

    def add_rows(self, rows: list[Any], leases: list[str] | None = None) -> int:
        self.sending.set()
        assert self.go.wait(10)
        return super().add_rows(rows, leases)


def test_a_result_waits_for_the_batch_in_flight_with_its_spans(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job], [claimed] = _claim(runners)
    rid = claimed["rollout_id"]
    client = _HeldClient(runners.url)
    remote = RemoteStore(client, batch_size=3, flush_interval=3600.0)
    remote.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), claimed["lease"])
    spans = _spans(rid, 5)
    remote.add_spans(spans[:3])  # a full batch: the flusher takes it, and is held
    assert client.sending.wait(10)
    remote.add_spans(spans[3:])
    finisher = threading.Thread(target=remote.finish_rollout, args=(rid, "succeeded", 1.0))
    finisher.start()
    finisher.join(0.3)
    assert finisher.is_alive() and not job.done  # the result waits for the batch in flight
    client.go.set()
    finisher.join(10)
    assert not finisher.is_alive() and remote.dropped == 0
    assert remote.last_result[rid] == {"counted": True, "status": "succeeded", "accepted": 2}
    assert sorted(s.span_id for s in store.spans(rid)) == sorted(s.span_id for s in spans)
    assert (job.status, job.reward) == ("succeeded", 1.0)
    remote.close()
    client.close()


def test_a_result_with_spans_without_its_lease_writes_nothing(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job, _], [claimed, other] = _claim(runners, 2)
    rid = claimed["rollout_id"]
    rows = _wire(_spans(rid, 4))
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        for lease in (None, "guessed", other["lease"]):
            r = _complete(http, rid, lease, {"status": "succeeded", "reward": -1.0, "rows": rows})
            assert r.status_code == 403 and r.json()["error"]["code"] == "invalid_lease", r.text
    ro = store.get_rollout(rid)
    assert (ro.status, ro.reward, store.spans(rid), job.done) == ("running", None, [], False)
    # the runner's own RemoteStore with a wrong token: refused, and its rows are counted as lost
    client = RunnerClient(runners.url, api_key=KEY)
    remote = RemoteStore(client, flush_interval=3600.0)
    remote.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), other["lease"])
    remote.add_spans(_spans(rid, 4))
    with pytest.raises(RemoteError) as exc:
        remote.finish_rollout(rid, "succeeded", reward=-1.0)
    assert exc.value.status == 403 and remote.dropped == 4
    assert store.spans(rid) == [] and not job.done
    remote.close()
    client.close()


def test_spans_with_a_result_after_the_lease_expired_are_dropped_and_counted(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY, lease_timeout=5.0, max_attempts=1)
    queue = runners.queue
    assert queue is not None
    [job], [claimed] = _claim(runners)
    rid = claimed["rollout_id"]
    queue.reap(now=queue._attempts[rid].lease_expires + 1)  # the runner was too slow
    assert job.status == "failed"
    client = RunnerClient(runners.url, api_key=KEY)
    remote = RemoteStore(client, flush_interval=3600.0)
    remote.register(Rollout(rollout_id=rid, start_time=0.0, mode="train"), claimed["lease"])
    remote.add_spans(_spans(rid, 5))
    remote.finish_rollout(rid, "succeeded", reward=1.0)
    answer = remote.last_result[rid]
    assert answer["counted"] is False and (answer["accepted"], answer["dropped"]) == (0, 5)
    assert remote.dropped == 5
    ro = store.get_rollout(rid)
    assert (ro.status, ro.reward, store.spans(rid)) == ("failed", None, [])
    assert ro.metadata["late_result"]["reward"] == 1.0 and (job.status, job.reward) == ("failed", None)
    remote.close()
    client.close()


def test_a_retried_result_with_spans_keeps_one_copy_and_one_reward(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job, job2], [claimed, claimed2] = _claim(runners, 2)
    rid, lease = claimed["rollout_id"], claimed["lease"]
    body = {"status": "succeeded", "reward": 0.5, "rows": _wire(_spans(rid, 6))}
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        first = _complete(http, rid, lease, body).json()
        again = _complete(http, rid, lease, body).json()
        assert first == {"counted": True, "status": "succeeded", "accepted": 6}
        assert again == {
            "counted": True,
            "status": "succeeded",
            "duplicate": True,
            "accepted": 0,
            "stored_before": 6,
        }
        # the same request sent twice at once (a retry while the first is still in the handler)
        rid2, lease2 = claimed2["rollout_id"], claimed2["lease"]
        body2 = {"status": "succeeded", "reward": 0.25, "rows": _wire(_spans(rid2, 6))}
        with ThreadPoolExecutor(2) as pool:
            both = list(pool.map(lambda _: _complete(http, rid2, lease2, body2).json(), range(2)))
    assert [a["counted"] for a in both] == [True, True] and sum("duplicate" in a for a in both) == 1
    assert all(a.get("dropped", 0) == 0 for a in both)
    for j, r, reward in ((job, rid, 0.5), (job2, rid2, 0.25)):
        ro = store.get_rollout(r)
        assert (j.status, j.reward, ro.status, ro.reward) == ("succeeded", reward, "succeeded", reward)
        assert sorted(s.span_id for s in store.spans(r)) == sorted(f"{r}:{i}" for i in range(6))
        assert "late_result" not in ro.metadata


def test_malformed_rows_with_a_result_are_a_4xx_and_nothing_is_written(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job, _], [claimed, other] = _claim(runners, 2)
    rid, lease = claimed["rollout_id"], claimed["lease"]
    good = _wire(_spans(rid, 3))
    bad_kind = [*good[:2], ["x", rid, None, "nonsense", *good[0][4:]]]
    bad_json = [*good[:2], [*good[2][:10], "{not json", *good[2][11:]]]
    short = [*good[:2], good[2][:5]]
    foreign = [*good[:2], [f"{other['rollout_id']}:0", other["rollout_id"], *good[2][2:]]]
    with httpx.Client(base_url=runners.url, headers={**AUTH, "x-agl-lease": lease}) as http:
        for rows, words in (
            ({"a": 1}, "must be a list"),
            (bad_kind, "span kind"),
            (bad_json, "input"),
            (short, "17 fields"),
            (foreign, "spans of its rollout"),
        ):
            r = _complete(http, rid, None, {"status": "succeeded", "reward": 1.0, "rows": rows})
            assert r.status_code == 400, (words, r.text)
            err = r.json()["error"]
            assert words in err["message"], err
            assert (store.spans(rid), store.spans(other["rollout_id"]), job.done) == ([], [], False)
        assert store.get_rollout(rid).status == "running"
        # the server keeps serving: the well-formed result goes through
        r = _complete(http, rid, None, {"status": "succeeded", "reward": 1.0, "rows": good})
        assert r.json() == {"counted": True, "status": "succeeded", "accepted": 3}
    assert len(store.spans(rid)) == 3 and (job.status, job.reward) == ("succeeded", 1.0)


def test_a_result_without_rows_still_works(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    [job], [claimed] = _claim(runners)
    rid, lease = claimed["rollout_id"], claimed["lease"]
    with RunnerClient(runners.url, api_key=KEY) as client:
        assert client.add_rows(_wire(_spans(rid, 2)), leases=[lease]) == 2
        answer = client.complete(rid, "succeeded", reward=1.0, lease=lease)
    assert answer == {"counted": True, "status": "succeeded"}  # no rows: no "accepted"
    assert len(store.spans(rid)) == 2 and (job.status, job.reward) == ("succeeded", 1.0)


def test_a_result_can_bring_the_workers_next_rollout(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    queue = runners.queue
    assert queue is not None
    [first_job], [claimed] = _claim(runners)
    [second_job] = queue.submit([("next", "train", {"k": 1})])
    rid, lease = claimed["rollout_id"], claimed["lease"]
    body = {"status": "succeeded", "reward": 1.0, "rows": _wire(_spans(rid, 2)), "claim": {"worker": "w0"}}
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        # a wrong lease: no result, no claim (the job stays queued)
        r = _complete(http, rid, "guessed", body)
        assert r.status_code == 403 and queue.stats()["queued"] == 1
        r = _complete(http, rid, None, {**body, "claim": "w0"})  # malformed: a 400 before anything
        assert r.status_code == 400 and r.json()["error"]["param"] == "claim"
        assert (store.spans(rid), first_job.done, queue.stats()["queued"]) == ([], False, 1)
        answer = _complete(http, rid, lease, body).json()
        nxt = answer.pop("next")
        assert answer == {"counted": True, "status": "succeeded", "accepted": 2}
        assert nxt["task"] == "next" and nxt["metadata"] == {"k": 1} and len(nxt["lease"]) >= 32
        assert nxt["llm_path"] == f"/rollout/{nxt['rollout_id']}/lease/{nxt['lease']}/v1"
        assert (first_job.status, queue.stats()["queued"], queue.stats()["running"]) == ("succeeded", 0, 1)
        # the same result again (its answer lost): the same next rollout, not a second claim
        again = _complete(http, rid, lease, body).json()
        assert again["duplicate"] is True and again["next"] == nxt
        assert queue.stats()["running"] == 1
        # the next rollout's result, with the queue empty: next is null, never waited for
        body2 = {"status": "succeeded", "reward": 0.5, "claim": {"worker": "w0"}}
        last = _complete(http, nxt["rollout_id"], nxt["lease"], body2).json()
        assert last == {"counted": True, "status": "succeeded", "next": None}
    assert (second_job.status, second_job.reward) == ("succeeded", 0.5)
    assert len(store.spans(rid)) == 2


def test_the_runner_takes_its_next_rollout_with_each_result(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None

    def agent(task: int, llm: agl.LLM) -> float:
        with agl.Tracer.current_rollout().tracer.span("tool", "calc") as sp:
            sp.set_output(task)
        return 1.0

    runner = agl.remote.Runner(agent, runners.url, api_key=KEY, workers=2, max_rollouts=12)
    granted: list[str] = []
    plain_claim = runner.client.claim

    def claim(worker: str, wait: float = 10.0) -> dict[str, Any] | None:
        out = plain_claim(worker, wait=wait)
        if out is not None:
            granted.append(out["rollout_id"])
        return out

    runner.client.claim = claim  # type: ignore[method-assign]
    jobs = runners.queue.submit([(i, "train", {}) for i in range(12)])  # queued before the runner starts
    with runner:  # the workers end after 12 rollouts: a slot taken for a next claim that did
        assert runner.join(30)  # not come would leave a job unrun
    assert [(j.status, j.reward) for j in jobs] == [("succeeded", 1.0)] * 12
    assert len(granted) == 2  # one claim a worker; every other rollout came with a result
    assert runner.counted == 12 and runner.store.dropped == 0
    assert [[s.kind for s in store.spans(j.rollout_id)] for j in jobs] == [["tool", "reward"]] * 12
