"""The web view over real SQLite files, served on 127.0.0.1 and read over real HTTP."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.store import ReadOnlyStore

for _module in ("starlette", "uvicorn", "jinja2"):  # the ui extra
    pytest.importorskip(_module)

from agentlightning_lite.ui import RunData, UIServer, group_advantages  # noqa: E402

from . import _stores  # noqa: E402


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    req = urllib.request.Request(url, headers=headers or {})

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a: Any, **k: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=30) as r:
            return r.status, r.read().decode(), r.headers
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), e.headers


def ids_in(html: str) -> list[str]:
    return re.findall(r'class="rollout-link" href="/rollouts/([^"]+)"', html)


def test_list_filters_and_sorts(view: Any) -> None:
    ids = view.ids
    code, html, _ = get(view.url + "/")
    assert code == 200
    assert set(ids_in(html)) == {*ids["train"], ids["val"], ids["failed"]}
    assert ids_in(html)[0] == ids["failed"]  # newest first
    assert set(ids_in(get(view.url + "/?mode=train")[1])) == set(ids["train"])
    assert ids_in(get(view.url + "/?status=failed")[1]) == [ids["failed"]]
    judged = get(view.url + "/?agent=judge")[1]  # the agent is on the spans, not the rollout
    assert set(ids_in(judged)) == set(ids["train"]) and '<span id="total">4</span>' in judged
    high = ids_in(get(view.url + "/?min_reward=0.5")[1])
    assert set(high) == {ids["train"][0], ids["train"][2], ids["val"]}
    low = ids_in(get(view.url + "/?max_reward=0.25&mode=train")[1])
    assert set(low) == {ids["train"][1], ids["train"][3]}
    by_reward = ids_in(get(view.url + "/?sort=reward&order=asc&mode=train")[1])
    assert set(by_reward[:2]) == {ids["train"][1], ids["train"][3]}  # the two 0.0 rewards first
    page = get(view.url + "/?mode=train")[1]
    assert "calculator" not in page and "judge" in page  # agents column lists solver, judge
    assert "1 tool error" in page


@pytest.mark.parametrize(
    "query, message",
    [
        ("mode=nope", "mode must be one of train, val, trace"),
        ("min_reward=abc", "min_reward must be a number"),
        ("limit=7", "limit must be one of"),
        ("after=xyz", "after must be KEY:ROWID"),
        ("sort=name", "sort must be one of start, reward, duration"),
    ],
)
def test_bad_query_is_a_400_naming_the_parameter(view: Any, query: str, message: str) -> None:
    code, html, _ = get(view.url + "/?" + query)
    assert code == 400 and message in html


def test_rollout_page_shows_the_span_tree(view: Any) -> None:
    rid = view.ids["train"][1]  # reward 0, its tool failed
    code, html, _ = get(view.url + f"/rollouts/{rid}")
    assert code == 200
    tree = html[html.index('id="span-tree"') :]
    # the agent span holds the llm and tool spans (nested list), the reward is at the root
    agent_at = tree.index(f'id="span-{rid}-agent"')
    assert agent_at < tree.index(f'id="span-{rid}-c1"') < tree.index(f'id="span-{rid}-tool"')
    assert "ZeroDivisionError: division by zero" in tree and 'class="outcome error"' in tree
    assert "what is 0+2?" in tree  # the call's messages
    assert "calculator({&#34;expr&#34;: &#34;x&#34;})" in tree  # the tool call it asked for
    assert "exact_match" in html and "(final)" in html
    assert re.search(r"\+\d+\.\d ms · \d+\.\d ms", tree)  # offset and duration of each span
    # the training signal of the rollout: its 2 policy calls, AIR's tool_status on the first
    table = html[html.index('id="transitions"') : html.index("</table>", html.index('id="transitions"'))]
    assert table.count("<tr>") == 3 and "-0.5" in table
    assert "have no token ids" in html  # the judge's call to another model, said loudly
    assert get(view.url + "/rollouts/nope")[0] == 404


def test_tokens_page_shades_by_the_advantage_trained_with(view: Any) -> None:
    rid = view.ids["train"][0]
    code, html, _ = get(view.url + f"/tokens/{rid}")
    assert code == 200
    assert '<strong id="shaded-by">advantage</strong>' in html
    # the group: this rollout (reward 1) and its twin (reward 0), 2 calls each, AIR on the tool call
    credited = re.findall(r'<td class="credited">([^<]+)</td>', html)
    assert credited == ["1.25", "1"]  # 1 + tool success 0.25 on the call before the tool; then 1
    twin = get(view.url + f"/tokens/{view.ids['train'][1]}")[1]
    assert re.findall(r'<td class="credited">([^<]+)</td>', twin) == ["-0.5", "0"]
    expected = group_advantages([1.25, 1.0, -0.5, 0.0])
    shown = [float(x) for x in re.findall(r'<td class="advantage">([^<]+)</td>', html)]
    assert shown == pytest.approx(expected[:2], abs=1e-3)
    # each response token of a trained call carries its id, logprob and value, decoded by the tokenizer
    assert 'title="id 99 · logprob -0.500 · advantage ' in html and ">c</span>" in html
    judge = html[html.index('id="call-2"') :]
    assert "not trained: recorded by a framework adapter without token ids" in judge
    assert "adapter solver" in html and "adapter (base model)" in judge
    assert "tool_error:calculator -0.5" in twin and "tool_ok:calculator 0.25" in html


def test_advantages_match_the_trainers_grpo() -> None:
    grpo = pytest.importorskip("agentlightning_lite.rl.grpo")
    rewards = [1.25, 1.0, 0.5, 0.0, 0.0]
    theirs, _ = grpo.group_advantages(rewards, ["g"] * len(rewards))
    assert group_advantages(rewards) == pytest.approx(theirs, abs=1e-9)
    assert group_advantages([0.3, 0.3, 0.3]) == [0.0, 0.0, 0.0]


def test_tokens_without_tokenizer_are_ids_and_val_rollouts_use_the_reward(small: dict[str, Any]) -> None:
    store = ReadOnlyStore(small["db"])
    try:
        with UIServer(RunData(store)) as server:
            html = get(server.url + f"/tokens/{small['ids']['val']}")[1]
    finally:
        store.close()
    assert '<strong id="shaded-by">reward</strong>' in html
    assert ">⟨118⟩</span>" in html  # "v" of "val answer", as an id
    assert "pass <code>--model</code> to decode them" in html


def test_run_page_and_metrics_follow_the_file(view: Any, small: dict[str, Any]) -> None:
    code, html, _ = get(view.url + "/run")
    assert code == 200 and "/static/uPlot.iife.min.js" in html and '"train/kl"' in html
    assert get(view.url + "/static/uPlot.iife.min.js")[0] == 200
    m = json.loads(get(view.url + "/api/metrics")[1])
    assert m["total"] == 5 and m["rows"][3]["val/reward_mean"] == pytest.approx(0.6)
    with open(small["run"] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "train/reward_mean": 0.9}) + "\n")
        f.write('{"step": 6, "train/rew')  # a row the trainer is still writing
    m = json.loads(get(view.url + "/api/metrics?since=5")[1])
    assert m["total"] == 6 and m["rows"] == [{"step": 5, "train/reward_mean": 0.9}] and m["age_s"] < 60
    assert get(view.url + "/api/metrics?since=-1")[0] == 400


def test_the_store_file_is_not_touched(small: dict[str, Any]) -> None:
    db: Path = small["db"]
    before = hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in db.parent.iterdir())
    store = ReadOnlyStore(db)
    with UIServer(RunData(store, small["run"])) as server:
        for path in (
            "/",
            "/?agent=solver",
            f"/rollouts/{small['ids']['train'][0]}",
            f"/tokens/{small['ids']['train'][0]}",
        ):
            assert get(server.url + path)[0] == 200
        with pytest.raises(PermissionError):
            store.add_spans([])
    store.close()
    after = hashlib.sha256(db.read_bytes()).hexdigest(), sorted(p.name for p in db.parent.iterdir())
    assert before == after


def test_api_key(small: dict[str, Any]) -> None:
    store = ReadOnlyStore(small["db"])
    with pytest.raises(ValueError, match="needs an API key"):
        UIServer(RunData(store), host="0.0.0.0")
    try:
        with UIServer(RunData(store), api_key="s3cret") as server:
            code, html, _ = get(server.url + "/")
            assert code == 401 and "?key=KEY" in html
            assert get(server.url + "/api/metrics")[0] == 401
            assert get(server.url + "/?key=wrong")[0] == 401
            assert get(server.url + "/", {"Authorization": "Bearer s3cret"})[0] == 200
            code, _, headers = get(server.url + "/?mode=train&key=s3cret")
            assert code == 303 and headers["location"] == "/?mode=train"
            cookie = headers["set-cookie"].split(";")[0]
            assert "httponly" in headers["set-cookie"].lower()
            assert get(server.url + "/?mode=train", {"Cookie": cookie})[0] == 200
    finally:
        store.close()


@pytest.mark.slow
def test_list_is_fast_on_100k_rollouts(tmp_path: Path) -> None:
    db = tmp_path / "big.db"
    t0 = time.perf_counter()
    _stores.big_store(db, 100_000)
    made = time.perf_counter() - t0
    store = ReadOnlyStore(db)
    try:
        with UIServer(RunData(store)) as server:
            get(server.url + "/")  # the first request warms the page cache
            timings = {}
            for query in (
                "",
                "sort=reward&order=asc",
                "mode=train&status=failed",
                "agent=agent3&min_reward=0.5",
                "sort=duration&limit=200",
            ):
                t = time.perf_counter()
                code, html, _ = get(server.url + "/?" + query)
                timings[query or "(none)"] = time.perf_counter() - t
                assert code == 200 and len(ids_in(html)) > 0
            # keyset pages: page 2 follows page 1 without overlap, "previous" gives page 1 back
            first = get(server.url + "/?sort=reward")[1]
            nxt = re.search(r'id="next" href="/\?([^"]+)"', first).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
            second = get(server.url + "/?" + nxt)[1]
            assert not set(ids_in(first)) & set(ids_in(second)) and len(ids_in(second)) == 50
            prev = re.search(r'id="prev" href="/\?([^"]+)"', second).group(1).replace("&amp;", "&")  # type: ignore[union-attr]
            assert ids_in(get(server.url + "/?" + prev)[1]) == ids_in(first)
            assert '<span id="total">100000</span>' in first
    finally:
        store.close()
    print(
        f"\n100,000-rollout store made in {made:.2f} s; list page:",
        ", ".join(f"{q}: {s * 1000:.0f} ms" for q, s in timings.items()),
    )
    assert max(timings.values()) < 2.0


def test_cli_serves_and_refuses_an_open_bind_without_key(small: dict[str, Any]) -> None:
    cmd = [sys.executable, "-m", "agentlightning_lite.cli", "ui", str(small["db"])]
    refused = subprocess.run(
        [*cmd, "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**__import__("os").environ, "AGL_API_KEY": ""},
    )
    assert refused.returncode == 2 and "needs an API key" in refused.stderr
    missing = subprocess.run(
        [*cmd[:-1], str(small["db"]) + ".nope"], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
    proc = subprocess.Popen(
        [*cmd, "--port", "0", "--output-dir", str(small["run"])], stderr=subprocess.PIPE, text=True
    )
    try:
        line = proc.stderr.readline()  # type: ignore[union-attr]
        url = re.search(r"at (http://127\.0\.0\.1:\d+)/", line).group(1)  # type: ignore[union-attr]
        code, html, _ = get(url + "/run")
        assert code == 200 and str(small["run"] / "metrics.jsonl") in html
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_run_page_lists_prompt_candidates(view: Any, small: dict[str, Any]) -> None:
    assert 'id="candidates"' not in get(view.url + "/run")[1]  # no prompt optimisation: no table
    folder = small["run"] / "apo" / "run-1"
    folder.mkdir(parents=True)
    rows = [
        {"id": "c0", "parent": None, "accepted": True, "prompts": {"system": "Be brief."}, "val_score": 0.4},
        {
            "id": "c1",
            "parent": "c0",
            "accepted": False,
            "prompts": {"system": "Be wordy."},
            "minibatch_score": 0.1,
            "parent_minibatch_score": 0.3,
            "reason": "not better on the minibatch",
        },
        {
            "id": "c2",
            "parent": "c0",
            "accepted": True,
            "prompts": {"system": "Show your work."},
            "val_score": 0.7,
        },
    ]
    (folder / "candidates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = get(view.url + "/run")[1]
    table = html[html.index('id="candidates"') : html.index("</table>", html.index('id="candidates"'))]
    assert table.count("<tr") == 4 and table.count("<strong>best</strong>") == 1
    best = table[table.index("c2") :]
    assert best.index("<strong>best</strong>") < best.index("</tr>") and "0.7 (val)" in best
    assert "rejected" in table and "not better on the minibatch" in table and "0.1 (minibatch)" in table
    assert "Show your work." in table


def test_the_view_needs_a_sqlite_store() -> None:
    import agentlightning_lite as agl

    with pytest.raises(TypeError, match="reads a SQLite store"):
        RunData(agl.MemoryStore())


def test_the_run_directory_is_found_beside_the_store(tmp_path: Path) -> None:
    """``agl-lite ui runs/NAME/runs.db`` without --output-dir: the trainer's metrics.jsonl lies beside it."""
    from agentlightning_lite.ui import RunData

    db = tmp_path / "run" / "runs.db"
    db.parent.mkdir()
    _stores.small_store(db)
    store = ReadOnlyStore(db)
    assert RunData(store).output_dir is None  # no metrics.jsonl (yet): nothing to show
    _stores.write_metrics(db.parent)
    assert RunData(store).output_dir == db.parent
    assert RunData(store, tmp_path / "elsewhere").output_dir == tmp_path / "elsewhere"  # --output-dir wins
    assert RunData(store).metrics()["total"] == 5  # the run page's rows
    store.close()


def test_the_view_and_the_cli_use_the_runs_recorded_credit_and_air(tmp_path: Path) -> None:
    """A run's credit and AIR travel with its rollouts: the view shows what the trainer used."""
    import agentlightning_lite as agl
    from agentlightning_lite.air import ToolStatus
    from agentlightning_lite.credit import Discounted, FinalReward
    from agentlightning_lite.run_settings import KEY, describe

    db = tmp_path / "runs.db"
    with agl.SQLiteStore(db) as store:
        tracer = agl.Tracer(store)
        run = describe(Discounted(1.0), [ToolStatus(success=0.1, error=-0.1)], "GRPO")
        with tracer.rollout("q", mode="train", metadata={KEY: run}) as ro:
            with tracer.span("llm", "chat") as sp:
                sp.set_output({"role": "assistant", "tool_calls": [{"id": "c1"}]})
            with tracer.span("tool", "calculator", attributes={"tool_call_id": "c1"}):
                pass
            ro.reward(1.0)
    store = ReadOnlyStore(db)
    data = RunData(store)
    assert data.credit == Discounted(1.0) and data.air == [ToolStatus(success=0.1, error=-0.1)]
    assert [t.reward for t in agl.transitions(store, credit=data.credit, air=data.air)] == [1.1]
    assert RunData(store, credit=FinalReward()).credit == FinalReward()  # a rule given wins
    store.close()
    out = subprocess.run(
        [sys.executable, "-m", "agentlightning_lite.cli", "transitions", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[0])["reward"] == pytest.approx(1.1)


def test_the_view_and_the_transitions_agree_on_which_calls_are_trained_and_why_not(tmp_path: Path) -> None:
    """One rollout with a trained call, another agent's call, a failed call, a side call, a framework's
    view of the trained call and a framework call without token ids: the tokens page trains exactly the
    calls ``agl.transitions`` gives and says, for each other one, the reason ``transitions.py`` gives."""
    import agentlightning_lite as agl
    from agentlightning_lite import join
    from agentlightning_lite.transitions import why_not_trained

    store = agl.SQLiteStore(tmp_path / "runs.db")
    ro = store.start_rollout({"q": "2+2?"}, mode="train", metadata={"step": 0, "task_index": 0})
    rid, t = ro.rollout_id, ro.start_time
    trained = _stores._llm(rid, "trained", t + 0.01, "writer", "2+2?", "4")
    spans = [
        trained,
        _stores._llm(rid, "critic", t + 0.02, "critic", "check 4", "ok"),
        _stores._llm(rid, "failed", t + 0.03, "writer", "again", "").model_copy(update={"status": "error"}),
        _stores._llm(rid, "title", t + 0.04, "side", "title?", "Sums"),
        trained.model_copy(  # the adapter's record of the trained call, joined to it
            update={
                "span_id": "view",
                "prompt_token_ids": None,
                "response_token_ids": None,
                "response_logprobs": None,
                "attributes": {join.SOURCE: "langchain", join.DUPLICATE_OF: "trained"},
            }
        ),
        _stores._llm(rid, "elsewhere", t + 0.05, "writer", "2+3?", "5").model_copy(
            update={
                "prompt_token_ids": None,
                "response_token_ids": None,
                "response_logprobs": None,
                "attributes": {join.SOURCE: "langchain"},
            }
        ),
    ]
    store.add_spans(spans)
    time.sleep(0.1)  # the rollout ends after its calls
    store.finish_rollout(rid, reward=1.0)
    store.close()

    agents = ["writer"]
    ro_store = ReadOnlyStore(tmp_path / "runs.db")
    try:
        with pytest.warns(RuntimeWarning, match="no token ids"):
            given = {t.metadata["span_id"] for t in agl.transitions(ro_store, agents=agents)}
        view = RunData(ro_store, tmp_path, agents=agents).token_view(rid)
        assert view is not None
        reasons = {c["span"].span_id: c["reason"] for c in view["calls"]}
        assert given == {"trained"} and {sid for sid, r in reasons.items() if r is None} == given
        joined = {s.span_id: s for s in join.resolve(ro_store.spans(rid))}
        for sid, reason in reasons.items():
            assert reason == why_not_trained(joined[sid], agents), sid
        assert reasons["critic"] == "agent 'critic' is not among the trained agents"
        assert reasons["failed"].startswith("the call failed") and reasons["title"].startswith("a side call")
        assert (
            reasons["view"].startswith("a framework's view") and "without token ids" in reasons["elsewhere"]
        )
    finally:
        ro_store.close()
