"""``agl-lite runs / show / transitions / export-sft / plot`` against a real SQLite store built here."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import ReadOnlyStore, main

# three rollouts with ids we choose, so prefixes are known: "aaaa1..." and "aaaa2..." share "aaaa"
GOOD = "aaaa1" + "0" * 27
BAD = "aaaa2" + "0" * 27
MULTI = "bbbb" + "0" * 28


def _calc_rollout(tracer: agl.Tracer, rid: str, answer: str, tool_ok: bool, reward: float) -> None:
    with tracer.rollout({"question": "What is 12 * 7?"}, mode="train", rollout_id=rid) as ro:
        with tracer.span("agent", "solver", agent="solver"):
            with tracer.span("llm", "chat", input=[{"role": "user", "content": "12*7?"}]) as sp:
                sp.set_output(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "calculator", "arguments": "{}"},
                            }
                        ],
                    }
                )
                sp.set_tokens([1, 2, 3, 4], [5, 6], [-0.1, -0.2], model="smollm2-135m")
            with tracer.span("tool", "calculator", input="12*7", attributes={"tool_call_id": "c1"}) as tool:
                if tool_ok:
                    tool.set_output(84)
                else:
                    tool.set_error("ZeroDivisionError: division by zero")
            with tracer.span("llm", "chat", input=[{"role": "user", "content": "12*7?"}]) as sp:
                sp.set_output({"role": "assistant", "content": answer})
                sp.set_tokens([1, 2, 3, 4, 5, 6, 7], [8, 9, 10], [-0.3] * 3, model="smollm2-135m")
        ro.reward(reward)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "runs.db"
    store = agl.SQLiteStore(path)
    tracer = agl.Tracer(store)
    _calc_rollout(tracer, GOOD, "84", tool_ok=True, reward=1.0)
    _calc_rollout(tracer, BAD, "85", tool_ok=False, reward=0.0)
    with tracer.rollout("write a poem", mode="val", rollout_id=MULTI) as ro:
        for agent, text in (
            ("writer", "Roses are red."),
            ("checker", "needs rhyme"),
            ("rewriter", "Roses..."),
        ):
            with tracer.span("llm", "chat", agent=agent, input=f"as the {agent}") as sp:
                sp.set_output(text)
                sp.set_tokens([1, 2], [3, 4, 5], [0.0] * 3)
        ro.reward(0.5)
    store.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def fingerprint(path: Path) -> tuple[str, int, list[str]]:
    return (
        hashlib.sha256(path.read_bytes()).hexdigest(),
        path.stat().st_mtime_ns,
        sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name)),  # -wal, -shm
    )


# -- runs -------------------------------------------------------------------------------------------
def test_runs_lists_status_reward_agents(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "runs", str(db), "--plain")
    assert code == 0
    lines = {line.split()[0]: line for line in out.splitlines() if line[:4] in ("aaaa", "bbbb")}
    assert set(lines) == {GOOD, BAD, MULTI}
    assert lines[GOOD].split()[1:4] == ["succeeded", "train", "1"]
    assert lines[BAD].split()[1:4] == ["succeeded", "train", "0"]
    assert "writer, checker, rewriter" in lines[MULTI] and " val " in lines[MULTI]
    assert "3 succeeded, mean reward 0.5" in out


def test_runs_rich_table_and_filters(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    code, out, _ = run(capsys, "runs", str(db), "--mode", "val")
    assert code == 0
    assert "┃ rollout" in out  # a rich table
    assert MULTI in out and GOOD not in out


def test_runs_json(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "runs", str(db), "--json")
    assert code == 0
    items = json.loads(out)
    assert [i["rollout_id"] for i in items] == [GOOD, BAD, MULTI]
    assert items[0]["reward"] == 1.0 and items[0]["agents"] == ["solver"] and items[0]["llm_calls"] == 2
    assert items[0]["spans"] == 5  # agent, 2 llm, tool, reward
    assert items[2]["agents"] == ["writer", "checker", "rewriter"] and items[2]["mode"] == "val"
    assert all(i["duration_s"] >= 0 for i in items)


def test_runs_limit_shows_newest(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "runs", str(db), "--limit", "1", "--plain")
    assert code == 0 and MULTI in out and GOOD not in out
    assert "showing the newest 1 of 3" in out


def test_runs_nothing_found_is_exit_3(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "runs", str(db), "--status", "timeout")
    assert code == 3 and out == ""
    assert "no rollouts" in err


# -- show -------------------------------------------------------------------------------------------
def test_show_tree_by_unique_prefix(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", str(db), "aaaa2", "--plain")
    assert code == 0
    assert out.startswith(f"rollout {BAD}  succeeded  reward 0  train")
    assert "5 spans, 2 LLM calls, 1 tool calls (1 failed)" in out
    lines = out.splitlines()
    tree = lines[lines.index(BAD) + 1 :]
    assert tree[0].startswith("├── agent solver  [solver]")
    assert tree[1].startswith("│   ├── llm chat  [solver]") and "4→2 tok" in tree[1]
    assert "tool calls: calculator" in tree[1]
    assert tree[2].startswith("│   ├── tool calculator  [solver]")
    assert "12*7 → ERROR ZeroDivisionError: division by zero" in tree[2]
    assert tree[3].startswith("│   └── llm chat") and "7→3 tok" in tree[3] and "'85'" in tree[3]
    assert tree[4].startswith("└── reward reward") and "= 0 (final)" in tree[4]


def test_show_tool_success_and_rich_tree(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("rich")
    code, out, _ = run(capsys, "show", str(db), GOOD)
    assert code == 0
    assert "12*7 → 84  ok" in out and "= 1 (final)" in out and "└── reward" in out


def test_show_json(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", str(db), "bbbb", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["rollout"]["rollout_id"] == MULTI and doc["rollout"]["reward"] == 0.5
    assert [s["agent"] for s in doc["spans"] if s["kind"] == "llm"] == ["writer", "checker", "rewriter"]


def test_show_ambiguous_prefix_is_usage_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "show", str(db), "aaaa")
    assert code == 2 and out == ""
    assert "ambiguous" in err and GOOD in err and BAD in err


def test_show_unknown_id_is_exit_3(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", str(db), "cccc")
    assert code == 3 and "no rollout with id or prefix 'cccc'" in err


def test_show_prefix_with_sql_wildcards_matches_literally(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, _ = run(capsys, "show", str(db), "%")
    assert code == 3  # "%" is not a LIKE wildcard here


# -- transitions ------------------------------------------------------------------------------------
def test_transitions_discounted_with_tool_rewards(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys, "transitions", str(db), "--rollout", "aaaa",
        "--credit", "discounted:0.9", "--tool-success", "0.1", "--tool-error", "-0.5", "--jsonl",
    )  # fmt: skip
    # "aaaa" is ambiguous as a --rollout too
    assert code == 2
    code, out, _ = run(
        capsys, "transitions", str(db), "--rollout", "aaaa2",
        "--credit", "discounted:0.9", "--tool-success", "0.1", "--tool-error", "-0.5", "--jsonl",
    )  # fmt: skip
    assert code == 0
    ts = [json.loads(line) for line in out.splitlines()]
    # call 0 asked for the failed tool: -0.5 + 0.9 * (final 0.0); call 1 gets the final reward 0.0
    assert [(t["index"], t["reward"]) for t in ts] == [(0, -0.5), (1, 0.0)]
    assert ts[0]["metadata"]["intermediate_rewards"] == [["tool_error:calculator", -0.5]]
    assert ts[0]["prompt_token_ids"] == [1, 2, 3, 4] and ts[0]["response_token_ids"] == [5, 6]


def test_transitions_table_final_credit(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "transitions", str(db), "--mode", "train", "--plain")
    assert code == 0
    assert "4 transition(s), credit FinalReward(add_intermediate=False)" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("aaaa")]
    assert [(r[0], r[1], r[2], r[3]) for r in rows] == [
        (GOOD, "0", "solver", "1"),
        (GOOD, "1", "solver", "1"),
        (BAD, "0", "solver", "0"),
        (BAD, "1", "solver", "0"),
    ]
    assert "7→3" in out


def test_transitions_agent_selection(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "transitions", str(db), "--agents", "writer,rewriter", "--json")
    assert code == 0
    ts = [json.loads(line) for line in out.splitlines()]
    assert [(t["agent"], t["index"], t["reward"]) for t in ts] == [("writer", 0, 0.5), ("rewriter", 2, 0.5)]


def test_transitions_nothing_found(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "transitions", str(db), "--agents", "nobody")
    assert code == 3 and out == "" and "no transitions" in err


def test_bad_credit_rule_is_usage_error(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["transitions", str(db), "--credit", "discounted:2"])
    assert exc.value.code == 2
    assert "gamma must be in [0, 1]" in capsys.readouterr().err


# -- export-sft -------------------------------------------------------------------------------------
def test_export_sft_min_reward(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_path = tmp_path / "sft" / "good.jsonl"
    code, out, _ = run(capsys, "export-sft", str(db), str(out_path), "--min-reward", "1")
    assert code == 0 and f"wrote 2 chat example(s) (rollouts with reward >= 1) to {out_path}" in out
    records = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert [r["rollout_id"] for r in records] == [GOOD, GOOD]
    assert records[1]["messages"] == [
        {"role": "user", "content": "12*7?"},
        {"role": "assistant", "content": "84"},
    ]
    code, out, _ = run(
        capsys, "export-sft", str(db), str(tmp_path / "none.jsonl"), "--min-reward", "2", "--json"
    )
    assert code == 3 and json.loads(out) == {"path": str(tmp_path / "none.jsonl"), "records": 0}


def test_export_sft_refuses_to_overwrite_the_store(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = fingerprint(db)
    code, _, err = run(capsys, "export-sft", str(db), str(db))
    assert code == 2 and "refusing to overwrite" in err
    assert fingerprint(db) == before


# -- plot -------------------------------------------------------------------------------------------
def test_plot_from_rollouts(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    code, out, _ = run(capsys, "plot", str(db), "--out", str(png), "--json")
    assert code == 0
    assert json.loads(out) == {"path": str(png), "source": "rollouts", "points": 3}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_plot_from_metrics_next_to_db(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    rows = [{"step": i, "train/reward_mean": i / 10} for i in range(1, 6)] + [
        {"step": 5, "val/reward_mean": 0.4, "val/success_rate": 0.4}
    ]
    (db.parent / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, _ = run(capsys, "plot", str(db))
    png = db.parent / "runs_reward_curve.png"
    assert code == 0 and out.strip() == f"wrote {png} (7 points from {db.parent / 'metrics.jsonl'})"
    assert png.stat().st_size > 5000
    code, out, _ = run(capsys, "plot", str(db), "--source", "rollouts", "--json")
    assert code == 0 and json.loads(out)["points"] == 3


def test_plot_without_rewards_is_exit_3(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "empty.db"
    with agl.SQLiteStore(path) as store:
        with agl.Tracer(store).rollout("no reward"):
            pass
    code, _, err = run(capsys, "plot", str(path))
    assert code == 3 and "no rewards to plot" in err
    assert not (tmp_path / "empty_reward_curve.png").exists()


# -- files that are missing, or not ours, and never touched ----------------------------------------
@pytest.mark.parametrize(
    "argv",
    [
        ["runs"],
        ["show", "--", "aaaa1"],
        ["transitions"],
        ["export-sft", "--", "OUT"],
        ["plot"],
    ],
)
def test_missing_file_is_exit_2_and_never_created(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.db"
    args = [argv[0], str(missing), *[str(tmp_path / "o.jsonl") if a == "OUT" else a for a in argv[1:]]]
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert err.strip() == f"agl-lite: error: no such file: {missing}"
    assert not missing.exists() and list(tmp_path.iterdir()) == []


def test_not_our_database_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all " * 50)
    for path, message in ((other, "not an agentlightning-lite store"), (text, "is not a SQLite database")):
        before = fingerprint(path)
        code, out, err = run(capsys, "runs", str(path))
        assert code == 2 and out == "" and message in err
        assert len(err.strip().splitlines()) == 1
        assert fingerprint(path) == before


def test_read_commands_never_change_the_file(
    db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = fingerprint(db)
    for argv in (
        ["runs", str(db)],
        ["show", str(db), "bbbb"],
        ["transitions", str(db), "--credit", "discounted"],
        ["export-sft", str(db), str(tmp_path / "x" / "sft.jsonl")],
    ):
        assert run(capsys, *argv)[0] == 0
    assert fingerprint(db) == before  # same bytes, same mtime, no -wal/-shm left behind


def test_reads_what_a_live_writer_committed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "live.db"
    store = agl.SQLiteStore(path)
    with agl.Tracer(store).rollout("q", rollout_id="dddd" + "0" * 28) as ro:
        ro.reward(0.25)
    store.flush()  # committed, writer still open (WAL file present)
    assert (tmp_path / "live.db-wal").exists()
    code, out, _ = run(capsys, "runs", str(path), "--json")
    assert code == 0 and json.loads(out)[0]["reward"] == 0.25
    store.close()


def test_read_only_store_refuses_writes(db: Path) -> None:
    store = ReadOnlyStore(db)
    with pytest.raises(PermissionError):
        store.start_rollout("x")
    assert len(store.rollouts()) == 3
    store.close()


def test_plain_fallback_without_rich(db: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    for name in ("rich", "rich.console", "rich.table", "rich.tree", "rich.text", "rich.markup"):
        monkeypatch.setitem(sys.modules, name, None)  # import rich... raises ImportError
    code, out, _ = run(capsys, "runs", str(db))
    assert code == 0 and "┃" not in out
    assert out.splitlines()[1].split() == [
        "rollout", "status", "mode", "reward", "duration", "agents", "llm", "spans", "started", "task",
    ]  # fmt: skip
    code, out, _ = run(capsys, "show", str(db), "aaaa1")
    assert code == 0 and "├── agent solver" in out


# -- the installed command, in its own process -----------------------------------------------------
def test_help_documents_exit_codes() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentlightning_lite.cli", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0
    for line in ("0  success", "1  runtime error", "2  usage error", "3  nothing found"):
        assert line in proc.stdout
    for command in ("serve", "train", "runs", "show", "transitions", "export-sft", "plot"):
        assert command in proc.stdout


def test_subprocess_exit_codes(db: Path, tmp_path: Path) -> None:
    env = {**os.environ, "AGL_PLAIN": "1"}

    def agl_lite(*argv: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "agentlightning_lite.cli", *argv]
        return subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)

    ok = agl_lite("runs", str(db))
    assert ok.returncode == 0 and GOOD in ok.stdout and "┃" not in ok.stdout
    assert agl_lite("show", str(db), "zzz").returncode == 3
    assert agl_lite("runs", str(tmp_path / "nope.db")).returncode == 2
    usage = agl_lite("runs")
    assert usage.returncode == 2 and "usage: agl-lite runs" in usage.stderr
    assert not (tmp_path / "nope.db").exists()
