"""The Spider benchmark: execution accuracy, read-only SQL, the split by database, and the LangGraph agent
(writer / checker / rewriter) against a real PolicyServer, with only the writer and rewriter trained."""

from __future__ import annotations

import argparse
import doctest
import hashlib
import json
import sqlite3
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import benchmarks.spider as spider  # noqa: E402
from benchmarks._harness import SHARED_DATA  # noqa: E402
from benchmarks.spider import data, exec_eval, readonly, sql_agent  # noqa: E402
from benchmarks.spider.__main__ import main  # noqa: E402

SPIDER = SHARED_DATA / "spider"
needs_data = pytest.mark.skipif(not (SPIDER / "dev.json").is_file(), reason="no Spider data in shared/data")


def db(db_id: str) -> Path:
    return SPIDER / "database" / db_id / f"{db_id}.sqlite"


def test_doctests() -> None:
    for module in (sql_agent, data, exec_eval):
        assert doctest.testmod(module, optionflags=doctest.ELLIPSIS).failed == 0, module.__name__


# -- execution accuracy ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gold", "pred", "ordered", "same"),
    [
        ([(1,), (1,), (2,)], [(2,), (1,), (1,)], False, True),  # a multiset: order ignored
        ([(1,), (1,), (2,)], [(1,), (2,), (2,)], False, False),  # ... but multiplicities count
        ([(1,), (2,)], [(2,), (1,)], True, False),  # ORDER BY in the gold query: order counts
        ([(1, "a"), (2, "b")], [("a", 1), ("b", 2)], True, True),  # columns in another order
        ([(1, 2), (3, 4)], [(1, 4), (3, 2)], False, False),  # same values per row set, wrong pairing
        ([], [], False, True),
        ([(1,)], [], False, False),
        ([(1, 2)], [(1,)], False, False),  # a column too few
    ],
)
def test_results_match(gold: list[tuple], pred: list[tuple], ordered: bool, same: bool) -> None:
    assert exec_eval.results_match(gold, pred, order_matters=ordered) is same


def test_normalize_sql_follows_spider() -> None:
    assert exec_eval.normalize_sql("SELECT count(DISTINCT a) FROM t WHERE b > = 2") == (
        "SELECT count(a) FROM t WHERE b >= 2"
    )
    assert exec_eval.normalize_sql("SELECT 'Distinct' , \"distinct\" FROM t") == (
        "SELECT 'Distinct' , \"distinct\" FROM t"
    )
    assert exec_eval.normalize_sql("SELECT DISTINCT a", keep_distinct=True) == "SELECT DISTINCT a"
    assert exec_eval.order_matters("select a from t ORDER BY a") and not exec_eval.order_matters("select a")


@needs_data
def test_execution_match_on_a_real_database() -> None:
    path = db("singer")
    gold = "SELECT Name , Citizenship FROM singer ORDER BY Net_Worth_Millions DESC"
    assert exec_eval.execution_match(path, gold, gold)
    # the same rows and order with the columns swapped and different spelling: a match
    assert exec_eval.execution_match(
        path, "select citizenship, name from singer order by net_worth_millions desc", gold
    )
    assert not exec_eval.execution_match(path, "SELECT Name, Citizenship FROM singer ORDER BY Name", gold)
    assert not exec_eval.execution_match(
        path, "SELECT Name FROM singer ORDER BY Net_Worth_Millions DESC", gold
    )
    assert not exec_eval.execution_match(path, "SELECT nope FROM singer", gold)  # an error is no match
    assert not exec_eval.execution_match(path, "DELETE FROM singer", gold)
    # no ORDER BY in the gold query: any row order matches
    assert exec_eval.execution_match(
        path, "SELECT Name FROM singer ORDER BY Name DESC", "SELECT Name FROM singer"
    )


# -- read-only execution -----------------------------------------------------------------------------
@needs_data
@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE singer",
        "INSERT INTO singer (Name) VALUES ('Mallory')",
        "UPDATE singer SET Name = 'x'",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA query_only = OFF",
        "SELECT 1; DROP TABLE singer",
    ],
)
def test_writes_are_refused(sql: str) -> None:
    path = db("singer")
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(readonly.SQLError):
        readonly.run_query(path, sql)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    assert readonly.run_query(path, "SELECT count(*) FROM singer") == [(8,)]


@needs_data
def test_read_only_without_the_authorizer_too() -> None:
    """The ``mode=ro`` URI and ``query_only`` refuse a write on their own (defence in depth)."""
    con = readonly.connect_readonly(db("singer"))
    try:
        con.set_authorizer(None)
        assert con.execute("PRAGMA query_only").fetchone() == (1,)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            con.execute("DROP TABLE singer")
        con.execute("PRAGMA query_only = OFF")
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            con.execute("DELETE FROM singer")
    finally:
        con.close()


@needs_data
def test_a_runaway_query_is_stopped_by_the_time_limit() -> None:
    t0 = time.monotonic()
    with pytest.raises(readonly.SQLError, match="time limit"):
        readonly.run_query(
            db("singer"),
            "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT count(*) FROM n",
            timeout_s=0.5,
        )
    assert time.monotonic() - t0 < 3.0


@needs_data
def test_rows_are_capped() -> None:
    infinite = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n"
    with pytest.raises(readonly.SQLError, match="more than 100 rows"):
        readonly.run_query(db("singer"), infinite, max_rows=100)
    assert len(readonly.run_query(db("singer"), infinite + " LIMIT 100", max_rows=100)) == 100


# -- data ----------------------------------------------------------------------------------------------
@needs_data
def test_split_is_by_database_and_deterministic() -> None:
    train = spider.load_dataset("train", SHARED_DATA)
    test = spider.load_dataset("test", SHARED_DATA)
    train_dbs, test_dbs = {t["db_id"] for t in train}, {t["db_id"] for t in test}
    assert train_dbs and test_dbs and not train_dbs & test_dbs  # no test database seen in training
    assert test_dbs == {"course_teach", "orchestra", "poker_player", "singer", "student_transcripts_tracking"}
    assert (len(train), len(test)) == (754, 218)  # 972 executable dev questions (wta_1 has no file)
    assert "wta_1" not in train_dbs | test_dbs
    assert all(spider.split_of(t["db_id"]) == "train" for t in train)
    assert spider.load_dataset("val", SPIDER) == test  # the CLI's name for it; a Spider dir works too
    assert [t["id"] for t in spider.load_dataset("train", SPIDER)] == [t["id"] for t in train]
    assert [t["id"] for t in spider.load_dataset("train", SPIDER, seed=1)] != [t["id"] for t in train]
    json.dumps(train[:3])  # tasks are plain JSON (they are stored with each rollout)


@needs_data
def test_tasks_carry_schema_and_executable_gold() -> None:
    tasks = spider.load_dataset("test", SHARED_DATA, max_schema_chars=300)
    assert tasks and {t["db_id"] for t in tasks} == {"singer", "poker_player"}
    task = next(t for t in tasks if t["db_id"] == "singer")
    assert task["schema"].splitlines() == [
        "CREATE TABLE singer (Singer_ID int PRIMARY KEY, Name text, Birth_Year real, "
        "Net_Worth_Millions real, Citizenship text);",
        "CREATE TABLE song (Song_ID int PRIMARY KEY, Title text, Singer_ID int REFERENCES singer(Singer_ID), "
        "Sales real, Highest_Position real);",
    ]
    for t in tasks:
        readonly.run_query(t["db_path"], t["query"])  # the gold query runs
    short = spider.load_dataset("train", SHARED_DATA, max_question_chars=40)
    assert short and all(len(t["question"]) <= 40 for t in short)
    with pytest.raises(ValueError, match="split"):
        spider.load_dataset("dev", SHARED_DATA)


def test_download_offline_says_to_pass_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(*_a: Any, **_k: Any) -> Any:
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(data.urllib.request, "urlopen", offline)
    monkeypatch.setenv("AGL_DATA_CACHE", str(tmp_path))
    with pytest.raises(SystemExit, match="--data-dir"):
        spider.load_dataset("train")
    assert not (tmp_path / "spider" / ".complete").exists()


def test_missing_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no dev\.json"):
        spider.load_dataset("train", tmp_path)


# -- the agent against a real PolicyServer ------------------------------------------------------------
GOLD = "SELECT count(*) FROM singer"
QUESTION = "How many singers are there?"


def role_of(messages: list[dict[str, Any]]) -> str:
    system = str(messages[0]["content"])
    return next(
        r
        for r, p in (("writer", "You write"), ("checker", "You check"), ("rewriter", "You fix"))
        if system.startswith(p)
    )


def scripted(writer: str, rewriter: str, verdicts: list[str]) -> tuple[Any, list[str]]:
    """A script answering by role (read from the system prompt); records the roles in call order."""
    calls: list[str] = []
    verdict_iter = iter(verdicts)

    def reply(messages: list[dict[str, Any]]) -> str:
        role = role_of(messages)
        calls.append(role)
        if role == "writer":
            return writer
        if role == "rewriter":
            return rewriter
        return next(verdict_iter)

    return reply, calls


def run_episode(script: Any, **agent_kwargs: Any) -> tuple[agl.MemoryStore, str, float]:
    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    task = {
        "question": QUESTION,
        "query": GOLD,
        "db_path": str(db("singer")),
        "schema": "CREATE TABLE singer (x);",
    }
    with PolicyServer(engines.ScriptedEngine(script, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = spider.SpiderAgent(**agent_kwargs)(task, server.llm(ro.id))
            ro.reward(reward)
    return store, ro.id, reward


@needs_data
def test_writer_checker_rewriter_and_only_two_are_trained() -> None:
    script, calls = scripted(
        writer="```sql\nSELECT count(*) FROM song\n```",  # wrong table
        rewriter="The query counts songs. Fixed:\n```sql\nSELECT count(*) FROM singer;\n```",
        verdicts=["It counts songs, not singers.\nTHE QUERY IS INCORRECT."],
    )
    store, rid, reward = run_episode(script, max_turns=2)
    assert calls == ["writer", "checker", "rewriter"]  # the last rewrite is not checked again
    assert reward == 1.0
    spans = store.spans(rid)
    server_llm = [s for s in spans if s.kind == "llm" and s.attributes.get("server") == "agl"]
    assert [s.agent for s in sorted(server_llm, key=lambda s: s.start_time)] == [
        "writer",
        "checker",
        "rewriter",
    ]
    langchain_llm = [s for s in spans if s.kind == "llm" and s.attributes.get("agl.source") == "langchain"]
    assert sorted(s.agent for s in langchain_llm) == ["checker", "rewriter", "writer"]
    assert all(s.attributes.get("agl.duplicate_of") for s in langchain_llm)  # joined with the server's
    (tool,) = [s for s in spans if s.kind == "tool"]
    assert (tool.name, tool.agent, tool.status) == ("run_sql", "checker", "ok")
    assert "(1 rows)" in str(tool.output)

    trained = agl.transitions(store, agents=["writer", "rewriter"])
    assert [t.agent for t in trained] == ["writer", "rewriter"]
    assert all(t.response_token_ids and t.reward == 1.0 for t in trained)
    assert "SELECT count(*) FROM singer" in trained[1].response["content"]
    everything = agl.transitions(store)
    assert sorted(t.agent for t in everything) == ["checker", "rewriter", "writer"]


@needs_data
def test_per_agent_endpoints_name_each_role_in_its_url() -> None:
    """``--policies separate``: each role calls through ``llm.for_agent(role)``, so the server knows the
    agent of every call when it serves it (and routes it to that agent's adapter)."""
    script, calls = scripted(
        writer="SELECT count(*) FROM song",
        rewriter="SELECT count(*) FROM singer",
        verdicts=["THE QUERY IS INCORRECT."],
    )
    store, rid, reward = run_episode(script, max_turns=2, per_agent_endpoints=True)
    assert calls == ["writer", "checker", "rewriter"] and reward == 1.0
    server_llm = [s for s in store.spans(rid) if s.kind == "llm" and s.attributes.get("server") == "agl"]
    assert sorted(s.agent for s in server_llm) == ["checker", "rewriter", "writer"]
    langchain_llm = [s for s in store.spans(rid) if s.attributes.get("agl.source") == "langchain"]
    assert langchain_llm and all(
        s.attributes.get("agl.duplicate_of") for s in langchain_llm if s.kind == "llm"
    )
    assert [t.agent for t in agl.transitions(store, agents=["writer", "rewriter"])] == ["writer", "rewriter"]


def test_policies_option_picks_shared_or_separate_adapters() -> None:
    from benchmarks.spider.__main__ import _policy_options

    ns = argparse.Namespace(policies="shared", lora_r=8, load_in_4bit=False)
    assert _policy_options(ns) == {"agents": ["writer", "rewriter"]}
    ns.policies = "separate"
    opts = _policy_options(ns)
    assert opts["lora"] is None and sorted(opts["policies"]) == ["rewriter", "writer"]
    assert all(lo.r == 8 and lo.alpha == 16 for lo in opts["policies"].values())


@needs_data
def test_checker_sees_sql_errors_and_a_correct_verdict_ends_the_run() -> None:
    script, calls = scripted(
        writer="SELECT nme FROM singer", rewriter="unused", verdicts=["THE QUERY IS CORRECT."]
    )
    store, rid, reward = run_episode(script, max_turns=3)
    assert calls == ["writer", "checker"] and reward == 0.0
    (tool,) = [s for s in store.spans(rid) if s.kind == "tool"]
    assert tool.status == "error" and "no such column" in str(tool.error)
    checker_call = next(t for t in agl.transitions(store) if t.agent == "checker")
    assert "Error: no such column: nme" in json.dumps(checker_call.prompt)


@needs_data
@pytest.mark.parametrize(
    ("written", "air"), [("SELECT nme FROM singer", -0.1), ("SELECT name FROM singer", 0.1)]
)
def test_air_rewards_the_call_that_wrote_the_query_by_whether_it_ran(written: str, air: float) -> None:
    """AIR: the checker's ``run_sql`` outcome goes to the writer's call (the checker is not trained);
    the rewriter's final query has only the final reward."""
    script, calls = scripted(
        writer=written, rewriter="SELECT count(*) FROM singer", verdicts=["THE QUERY IS INCORRECT."]
    )
    store, _, reward = run_episode(script, max_turns=2)
    assert calls == ["writer", "checker", "rewriter"] and reward == 1.0
    ts = agl.transitions(
        store, agents=list(spider.TRAINED_AGENTS), air=sql_agent.AIR, credit=sql_agent.CREDIT
    )
    assert [(t.agent, round(t.reward, 6)) for t in ts] == [("writer", 1.0 + air), ("rewriter", 1.0)]
    assert [t.agent for t in agl.transitions(store, agents=list(spider.TRAINED_AGENTS))] == [
        "writer",
        "rewriter",
    ]


@needs_data
def test_one_turn_is_the_writer_alone() -> None:
    script, calls = scripted(writer="SELECT count(*) FROM singer", rewriter="unused", verdicts=[])
    _, _, reward = run_episode(script, max_turns=1)
    assert calls == ["writer"] and reward == 1.0
    with pytest.raises(ValueError, match="max_turns"):
        spider.SpiderAgent(max_turns=0)


@needs_data
def test_turns_are_bounded() -> None:
    script, calls = scripted(
        writer="SELECT 1", rewriter="```sql\nSELECT 2\n```", verdicts=["THE QUERY IS INCORRECT."] * 5
    )
    _, _, reward = run_episode(script, max_turns=3)
    assert calls == ["writer", "checker", "rewriter", "checker", "rewriter"] and reward == 0.0


def test_cli_finds_the_benchmark() -> None:
    from agentlightning_lite.cli import load_agent

    found, module = load_agent("spider")
    assert isinstance(found, spider.SpiderAgent) and callable(module.load_dataset)


# -- one real step, end to end (the tiny Llama with SmolLM2's tokenizer: the plumbing, not the answers) --
@pytest.mark.slow
@needs_data
def test_smoke_one_step(tmp_path: Path, tiny_smol: Path) -> None:
    res = main(
        [
            "--model", str(tiny_smol), "--data-dir", str(SHARED_DATA), "--train-size", "2",
            "--test-size", "2", "--steps", "1",
            "--batch-size", "1", "--group-size", "2", "--max-tokens", "32", "--max-schema-chars", "420",
            "--threads", "1", "--no-record", "--output-dir", str(tmp_path),
        ]
    )  # fmt: skip
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["benchmark"] == "spider" and saved["steps"] == 1
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    for phase in ("before", "after"):
        assert saved[phase]["n"] == 2 and 0.0 <= saved[phase]["mean_reward"] <= 1.0
        assert 1.0 <= saved[phase]["turns"] <= 2.0 and 0.0 <= saved[phase]["writer_acc"] <= 1.0
    assert res["after"] == saved["after"]
    train_dbs, test_dbs = (
        set(part.split(", ")) for part in saved["notes"].split("train dbs ")[1].split("; test dbs ")
    )
    assert test_dbs <= {"singer", "poker_player", "course_teach"} and not train_dbs & test_dbs


@pytest.mark.slow
@needs_data
def test_smoke_one_step_with_an_adapter_per_role(tmp_path: Path, tiny_smol: Path) -> None:
    main(
        [
            "--model", str(tiny_smol), "--data-dir", str(SHARED_DATA), "--train-size", "1",
            "--test-size", "1", "--steps", "1",
            "--batch-size", "1", "--group-size", "2", "--max-tokens", "24", "--max-schema-chars", "420",
            "--threads", "1", "--no-record", "--output-dir", str(tmp_path), "--policies", "separate",
        ]
    )  # fmt: skip
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["variant"] == "policies separate" and "--policies separate" in saved["command"]
    assert sorted(p.name for p in Path(saved["adapter"]).iterdir()) == ["rewriter", "writer"]
    store = agl.SQLiteStore(tmp_path / "runs.db")
    served = {
        (s.agent, s.attributes.get("adapter"))
        for r in store.rollouts(mode="train")
        for s in store.spans(r.rollout_id)
        if s.kind == "llm" and s.attributes.get("server") == "agl"
    }
    store.close()
    assert ("writer", "writer") in served and all(a == (r if r != "checker" else None) for r, a in served)
    from benchmarks._harness import HEADER, record

    md = tmp_path / "RESULTS.md"
    record(saved, md)
    assert md.read_text().startswith("# Benchmark results") and HEADER in md.read_text()
    assert "| spider (policies separate) |" in md.read_text()


@needs_data
def test_teacher_writes_the_gold_query_and_only_the_writer_is_trained() -> None:
    from benchmarks.spider.teacher import teacher_reply

    store, rid, reward = run_episode(teacher_reply({QUESTION: {"question": QUESTION, "query": GOLD}}))
    assert reward == 1.0
    ts = agl.transitions(store, rollout_ids=[rid], agents=list(sql_agent.TRAINED_AGENTS))
    assert [t.agent for t in ts] == ["writer"]  # the checker accepted: no rewrite; its call is not trained
    assert ts[0].response["content"] == "```sql\n" + GOLD  # cut at the writer's stop string, ";"
