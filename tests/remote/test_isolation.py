"""Runner isolation: a claimed rollout is acted on only with its claim's lease token.

Two runners share the API key; only the one holding a claim's lease can heartbeat, complete,
reward or write spans (native rows, span objects, OTLP) for that rollout. Rewards stop once the
outcome is counted; a retried rollout's new claim has a new token and the old one is dead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.remote import RemoteError, RemoteStore, RunnerClient
from agentlightning_lite.store.rows import SpanRow

KEY = "shared-key"
AUTH = {"authorization": f"Bearer {KEY}"}


def _row(span_id: str, rid: str) -> list[Any]:
    return [span_id, rid, None, "tool", "t", None, 1.0, 2.0, "ok", None, "null", "null", "{}",
            None, None, None, None]  # fmt: skip


def _otlp(rid: str, lease: str | None = None) -> dict[str, Any]:
    attrs = [{"key": "agentlightning.rollout_id", "value": {"stringValue": rid}}]
    if lease is not None:
        attrs.append({"key": "agentlightning.lease", "value": {"stringValue": lease}})
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "execute_tool calc",
        "startTimeUnixNano": "1700000000000000000",
        "endTimeUnixNano": "1700000000250000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
            {"key": "gen_ai.tool.name", "value": {"stringValue": "calculator"}},
            *attrs,
        ],
    }
    return {"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [span]}]}]}


def _writes(rid: str) -> list[tuple[str, dict[str, Any]]]:
    """Every kind of write one can aim at a rollout."""
    return [
        ("/agl/v1/heartbeat", {"worker": "intruder", "rollout_ids": [rid]}),
        (f"/agl/v1/rollouts/{rid}/complete", {"status": "succeeded", "reward": -1.0}),
        (f"/agl/v1/rollouts/{rid}/reward", {"reward": -1.0}),
        ("/agl/v1/spans", {"rows": [_row("forged", rid)]}),
        ("/v1/traces", _otlp(rid)),
        (f"/rollout/{rid}/v1/traces", _otlp(rid)),
    ]


def _refused(http: httpx.Client, rid: str, lease_header: str | None) -> None:
    headers = {**AUTH, **({"x-agl-lease": lease_header} if lease_header is not None else {})}
    for path, body in _writes(rid):
        r = http.post(path, json=body, headers=headers)
        assert r.status_code == 403, (path, lease_header, r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] == "invalid_lease" and "X-AGL-Lease" in err["message"], err


def test_a_second_runner_cannot_act_on_the_first_runners_rollout(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    queue = runners.queue
    assert queue is not None
    [job, other_job] = queue.submit([("2+2?", "train", {}), ("3+3?", "train", {})])
    holder = RunnerClient(runners.url, api_key=KEY)
    claimed = holder.claim("holder", wait=1.0)
    assert claimed is not None and len(claimed["lease"]) >= 32
    rid = claimed["rollout_id"]
    expires = queue._attempts[rid].lease_expires
    # the intruder has the key, and a claim of its own: neither opens the holder's rollout
    intruder = RunnerClient(runners.url, api_key=KEY)
    own = intruder.claim("intruder", wait=1.0)
    assert own is not None and own["lease"] != claimed["lease"]
    with httpx.Client(base_url=runners.url) as http:
        for lease in (None, "", "guessed-token", own["lease"], claimed["lease"][:-1]):
            _refused(http, rid, lease)
        # a forged OTLP lease attribute is no better
        r = http.post("/v1/traces", json=_otlp(rid, own["lease"]), headers=AUTH)
        assert r.status_code == 403, r.text
        # a request touching the intruder's own rollout and the holder's is refused as a whole
        rows = {"rows": [_row("mine", own["rollout_id"]), _row("theirs", rid)]}
        r = http.post("/agl/v1/spans", json=rows, headers={**AUTH, "x-agl-lease": own["lease"]})
        assert r.status_code == 403, r.text
    with pytest.raises(RemoteError) as exc:
        intruder.complete(rid, "succeeded", reward=-1.0, lease=own["lease"])
    assert exc.value.status == 403 and exc.value.code == "invalid_lease"
    # what the key lets everyone read never shows the token
    for path in (f"/agl/v1/rollouts/{rid}", "/agl/v1/rollouts", "/agl/v1/status"):
        r = httpx.get(runners.url + path, headers=AUTH)
        assert r.status_code == 200 and claimed["lease"] not in r.text, path
    # nothing changed: no outcome, no reward, no spans, the lease not renewed
    ro = store.get_rollout(rid)
    assert (ro.status, ro.reward, store.spans(rid)) == ("running", None, [])
    assert not job.done and queue._attempts[rid].lease_expires == expires
    assert store.spans(own["rollout_id"]) == []
    # the holder's heartbeat, spans and result go through, and its result is the outcome
    assert holder.heartbeat("holder", [rid], leases=[claimed["lease"]]) == []
    assert holder.add_rows([_row("s1", rid)], leases=[claimed["lease"]]) == 1
    answer = holder.complete(rid, "succeeded", reward=1.0, lease=claimed["lease"])
    assert answer == {"counted": True, "status": "succeeded"}
    assert (job.status, job.reward) == ("succeeded", 1.0)
    assert store.get_rollout(rid).reward == 1.0 and [s.span_id for s in store.spans(rid)] == ["s1"]
    # after the outcome: the intruder's result and reward are refused, its spans and heartbeats
    # change nothing (an ended rollout takes no spans), the holder's retried call is a duplicate
    with httpx.Client(base_url=runners.url, headers={**AUTH, "x-agl-lease": own["lease"]}) as http:
        for path, body in _writes(rid)[1:3]:
            assert http.post(path, json=body).status_code == 403, path
        r = http.post("/agl/v1/spans", json={"rows": [_row("s1", rid)]})
        assert r.json() == {"accepted": 0, "dropped": 1}
        assert http.post("/agl/v1/heartbeat", json=_writes(rid)[0][1]).json()["lost"] == [rid]
        assert http.post("/v1/traces", json=_otlp(rid)).status_code == 200
    ro = store.get_rollout(rid)
    assert (ro.status, ro.reward, "late_result" in ro.metadata) == ("succeeded", 1.0, False)
    assert [(s.span_id, s.name) for s in store.spans(rid)] == [("s1", "t")]
    again = holder.complete(rid, "succeeded", reward=1.0, lease=claimed["lease"])
    assert again["duplicate"] is True and again["status"] == "succeeded"
    assert not other_job.done
    holder.close()
    intruder.close()


def test_no_reward_change_once_the_outcome_is_counted(served: Callable[..., agl.RemoteRunners]) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None
    [job] = runners.queue.submit([("t", "train", {})])
    client = RunnerClient(runners.url, api_key=KEY)
    claimed = client.claim("w", wait=1.0)
    assert claimed is not None
    rid, lease = claimed["rollout_id"], claimed["lease"]
    client.set_reward(rid, 0.25, lease=lease)  # while running: recorded
    assert store.get_rollout(rid).reward == 0.25
    assert client.complete(rid, "succeeded", lease=lease)["counted"] is True
    assert job.reward is None and store.get_rollout(rid).reward == 0.25  # training reads the store
    with pytest.raises(RemoteError) as exc:
        client.set_reward(rid, 1.0, lease=lease)  # even with the lease
    assert exc.value.status == 409 and exc.value.code == "outcome_counted"
    assert store.get_rollout(rid).reward == 0.25
    # a rollout the runner started itself (trace mode) likewise, once it is finished
    ro = store.start_rollout("trace me")
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        assert http.post(f"/agl/v1/rollouts/{ro.rollout_id}/reward", json={"reward": 0.5}).status_code == 200
        store.finish_rollout(ro.rollout_id, "failed")
        r = http.post(f"/agl/v1/rollouts/{ro.rollout_id}/reward", json={"reward": 1.0})
    assert r.status_code == 409 and r.json()["error"]["code"] == "outcome_counted"
    assert store.get_rollout(ro.rollout_id).reward == 0.5
    client.close()


def test_a_stale_lease_after_the_rollout_is_claimed_again_is_refused(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY, lease_timeout=5.0, max_attempts=2)
    queue = runners.queue
    assert queue is not None
    [job] = queue.submit([("t", "train", {})])
    slow, fresh = RunnerClient(runners.url, api_key=KEY), RunnerClient(runners.url, api_key=KEY)
    first = slow.claim("slow", wait=1.0)
    assert first is not None
    queue.reap(now=queue._attempts[first["rollout_id"]].lease_expires + 1)  # the slow runner's lease ran out
    second = fresh.claim("fresh", wait=1.0)
    assert second is not None and second["attempt"] == 2
    assert second["rollout_id"] != first["rollout_id"] and second["lease"] != first["lease"]
    with httpx.Client(base_url=runners.url) as http:
        _refused(http, second["rollout_id"], first["lease"])  # the old token opens nothing new
        # under the old claim: its heartbeat learns the lease is lost, its spans are dropped...
        old = {**AUTH, "x-agl-lease": first["lease"]}
        r = http.post(
            "/agl/v1/heartbeat", json={"worker": "slow", "rollout_ids": [first["rollout_id"]]}, headers=old
        )
        assert r.json()["lost"] == [first["rollout_id"]]
        r = http.post("/agl/v1/spans", json={"rows": [_row("late", first["rollout_id"])]}, headers=old)
        assert r.json() == {"accepted": 0, "dropped": 1}
        # ... its reward is refused (that attempt's outcome, failed, is counted) ...
        r = http.post(f"/agl/v1/rollouts/{first['rollout_id']}/reward", json={"reward": 1.0}, headers=old)
        assert r.status_code == 409
    # ... and its result is kept as a late result, not the outcome
    late = slow.complete(first["rollout_id"], "succeeded", reward=1.0, lease=first["lease"])
    assert late["counted"] is False
    ro = store.get_rollout(first["rollout_id"])
    assert ro.status == "failed" and ro.reward is None and store.spans(ro.rollout_id) == []
    assert ro.metadata["late_result"]["reward"] == 1.0
    assert fresh.complete(second["rollout_id"], "succeeded", reward=0.5, lease=second["lease"])["counted"]
    assert (job.status, job.reward, job.rollout_id) == ("succeeded", 0.5, second["rollout_id"])
    slow.close()
    fresh.close()


def test_otlp_spans_may_carry_their_lease_as_an_attribute_never_stored(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None
    runners.queue.submit([("t", "train", {})])
    client = RunnerClient(runners.url, api_key=KEY)
    claimed = client.claim("js", wait=1.0)
    assert claimed is not None
    rid = claimed["rollout_id"]
    r = httpx.post(runners.url + "/v1/traces", json=_otlp(rid, claimed["lease"]), headers=AUTH)
    assert r.status_code == 200, r.text
    [sp] = store.spans(rid)
    assert sp.name == "calculator" and "agentlightning.lease" not in sp.attributes
    assert claimed["lease"] not in str(sp.model_dump())
    client.close()


def test_the_python_runner_carries_the_lease_for_the_agent(served: Callable[..., agl.RemoteRunners]) -> None:
    """An unchanged agent: spans, a reward set mid-run and the result all reach the rollout."""
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)

    def agent(task: str, llm: agl.LLM) -> float:
        ro = agl.Tracer.current_rollout()
        with ro.tracer.span("tool", "calc") as sp:
            sp.set_output(4)
        ro.tracer.store.set_reward(ro.id, 0.5)  # a reward recorded on its own, mid-run
        agl.emit_reward(1.0)
        return None  # type: ignore[return-value]

    with agl.remote.Runner(agent, runners.url, api_key=KEY, workers=2) as runner:
        jobs = runners.run([("a", "train", {}), ("b", "train", {})])
    assert [(j.status, j.reward) for j in jobs] == [("succeeded", 1.0)] * 2
    assert runner.counted == 2 and isinstance(runner.store, RemoteStore) and runner.store.dropped == 0
    for j in jobs:
        assert [s.kind for s in store.spans(j.rollout_id)] == ["tool", "reward"]


def test_many_rollouts_tokens_go_in_small_requests(
    served: Callable[..., agl.RemoteRunners], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner with hundreds of rollouts in flight: at most 64 tokens per request, all accepted."""
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None
    n = 150
    runners.queue.submit([("t", "train", {})] * n)
    client = RunnerClient(runners.url, api_key=KEY)
    sent: list[int] = []
    real = client.request

    def spy(*args: Any, leases: list[str] | None = None, **kw: Any) -> Any:
        sent.append(len(leases or ()))
        return real(*args, leases=leases, **kw)

    monkeypatch.setattr(client, "request", spy)
    claims = [client.claim("w", wait=0.5) for _ in range(n)]
    rids, leases = [c["rollout_id"] for c in claims], [c["lease"] for c in claims]
    sent.clear()
    assert client.heartbeat("w", rids, leases=leases) == []
    assert sent == [64, 64, 22]
    remote = RemoteStore(client, batch_size=10_000, flush_interval=60.0)
    for c in claims:
        remote.register(agl.Rollout(rollout_id=c["rollout_id"], start_time=0.0), lease=c["lease"])
    sent.clear()
    remote.add_span_rows([SpanRow(*_row(f"s{i}", rid)) for i, rid in enumerate(rids)])
    remote.flush()
    assert sent == [64, 64, 22] and remote.dropped == 0
    assert all(len(store.spans(rid)) == 1 for rid in rids)
    remote.close()
    client.close()


def _chat(rid: str) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """Every way to route an LLM call to a rollout: (path, body, extra headers)."""
    chat = {"messages": [{"role": "user", "content": "2+2?"}], "max_tokens": 4}
    completion = {"prompt": "2+2=", "max_tokens": 4}
    return [
        (f"/rollout/{rid}/v1/chat/completions", chat, {}),
        (f"/rollout/{rid}/v1/completions", completion, {}),
        (f"/rollout/{rid}/agent/solver/v1/chat/completions", chat, {}),
        ("/v1/chat/completions", chat, {"x-agl-rollout-id": rid}),
        (f"/rollout/{rid}/lease/forged/v1/chat/completions", chat, {}),
        (f"/rollout/{rid}/lease/forged/agent/solver/v1/completions", completion, {}),
    ]


def test_llm_calls_to_a_claimed_rollout_need_its_lease(served: Callable[..., agl.RemoteRunners]) -> None:
    """An intruder with the key but not the lease cannot add LLM spans (token ids: training data)."""
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    assert runners.queue is not None
    runners.queue.submit([("2+2?", "train", {})])
    holder = RunnerClient(runners.url, api_key=KEY)
    claimed = holder.claim("holder", wait=1.0)
    assert claimed is not None
    rid, lease = claimed["rollout_id"], claimed["lease"]
    assert claimed["llm_path"] == f"/rollout/{rid}/lease/{lease}/v1"
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        for path, body, headers in _chat(rid):
            for extra in ({}, {"x-agl-lease": "forged"}, {"x-agl-lease": claimed["lease"][:-1]}):
                r = http.post(path, json=body, headers={**headers, **extra})
                assert r.status_code == 403, (path, extra, r.status_code, r.text)
                assert r.json()["error"]["code"] == "invalid_lease"
        assert store.spans(rid) == []  # nothing recorded
        # the holder: the lease in the URL it was given, or in the header
        r = http.post(claimed["llm_path"] + "/chat/completions", json=_chat(rid)[0][1])
        assert r.status_code == 200, r.text
        r = http.post(f"/rollout/{rid}/v1/completions", json=_chat(rid)[1][1], headers={"x-agl-lease": lease})
        assert r.status_code == 200, r.text
        r = http.post(claimed["llm_path"] + "/traces", json=_otlp(rid))  # OTLP beside it takes it too
        assert r.status_code == 200, r.text
    assert sorted(s.kind for s in store.spans(rid)) == ["llm", "llm", "tool"]
    assert all(lease not in str(s.model_dump()) for s in store.spans(rid))
    holder.close()


def test_an_unchanged_agent_building_its_own_client_works_under_the_lease(
    served: Callable[..., agl.RemoteRunners],
) -> None:
    """The agent builds its own OpenAI clients from ``llm.base_url`` and ``llm.api_key`` (one per
    agent too, with ``for_agent``): the runner's base URL carries the lease, so its calls land."""
    from openai import OpenAI

    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)

    def agent(task: str, llm: agl.LLM) -> float:
        replies = []
        for endpoint in (llm, llm.for_agent("checker")):
            client = OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            reply = client.chat.completions.create(
                model=endpoint.model, messages=[{"role": "user", "content": task}], max_tokens=32
            )
            replies.append(reply.choices[0].message.content or "")
        return float(all("4" in r for r in replies))

    with agl.remote.Runner(agent, runners.url, api_key=KEY) as runner:
        [job] = runners.run([("2+2?", "train", {})])
    assert (job.status, job.reward, job.error) == ("succeeded", 1.0, None)
    assert runner.counted == 1
    spans = [s for s in store.spans(job.rollout_id) if s.kind == "llm"]
    assert [s.agent for s in spans] == [None, "checker"]
    assert all(s.response_token_ids for s in spans)


def test_rollouts_without_a_lease_keep_the_plain_url(served: Callable[..., agl.RemoteRunners]) -> None:
    """In-process and trace rollouts (not handed out by the queue) need no lease."""
    store = agl.MemoryStore()
    runners = served(store, api_key=KEY)
    rid = store.start_rollout("2+2?", mode="train").rollout_id
    with httpx.Client(base_url=runners.url, headers=AUTH) as http:
        r = http.post(f"/rollout/{rid}/v1/chat/completions", json=_chat(rid)[0][1])
        assert r.status_code == 200, r.text
    assert [s.kind for s in store.spans(rid)] == ["llm"]
