"""Fuzz ``agl-lite``'s read commands: any arguments, and store files that are truncated, foreign,
random bytes or written by a newer schema. The rule: a one-line error and exit code 2 (usage) or 3
(nothing found), never a traceback, and the file is never changed."""

from __future__ import annotations

import hashlib
import sqlite3
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import agentlightning_lite as agl
from agentlightning_lite.cli import main

from .strategies import hostile_text

READS = ["runs", "show", "transitions", "export-sft", "plot"]


@pytest.fixture(scope="module")
def good_db() -> Path:
    path = Path(tempfile.mkdtemp()) / "runs.db"
    with agl.SQLiteStore(path) as store:
        tracer = agl.Tracer(store)
        for i in range(3):
            with tracer.rollout({"q": i}, mode="train") as ro:
                with tracer.span("llm", "chat", agent="a", input=[{"role": "user", "content": "x"}]) as sp:
                    sp.set_output({"role": "assistant", "content": "y"})
                ro.reward(float(i))
    return path


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "-"


def _argv(command: str, db: Path, tmp: Path) -> list[str]:
    extra = {"show": ["x"], "export-sft": [str(tmp / "o.jsonl")], "plot": ["--out", str(tmp / "c.png")]}
    return [command, str(db), *extra.get(command, [])]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    return code, err


@given(cut=st.integers(0, 40_000), command=st.sampled_from(READS))
def test_truncated_store(good_db: Path, cut: int, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "cut.db"
        bad.write_bytes(good_db.read_bytes()[:cut])
        before = _digest(bad)
        argv = _argv(command, bad, Path(tmp))
        code, err = _run(argv, capsys)
        assert code in (0, 2, 3), err
        if code == 2:
            assert err.startswith("agl-lite: error: ") and err.count("\n") == 1
        assert _digest(bad) == before


@given(raw=st.binary(max_size=2000), command=st.sampled_from(READS))
def test_random_bytes(raw: bytes, command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "x.db"
        bad.write_bytes(raw)
        argv = _argv(command, bad, Path(tmp))
        code, err = _run(argv, capsys)
        assert code == 2 and err.startswith("agl-lite: error: "), err
        assert bad.read_bytes() == raw


@pytest.mark.parametrize("command", READS)
def test_foreign_and_newer_databases(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE rollouts (x)")
    newer = tmp_path / "newer.db"
    with agl.SQLiteStore(newer) as store:
        store.start_rollout("t")
    with sqlite3.connect(newer) as c:
        version = c.execute("PRAGMA user_version").fetchone()[0]
        c.execute(f"PRAGMA user_version = {version + 1}")
    for path, words in ((foreign, "not an agentlightning-lite store"), (newer, "newer")):
        before = _digest(path)
        argv = _argv(command, path, tmp_path)
        code, err = _run(argv, capsys)
        assert code == 2, err
        assert words in err
        assert _digest(path) == before
    with pytest.raises(ValueError, match="newer"):
        agl.SQLiteStore(newer)


@given(args=st.lists(st.one_of(hostile_text.filter(lambda a: "\x00" not in a),
                               st.sampled_from(["--limit", "-1", "0", "--json", "--plain", "--mode", "train",
                                                "--status", "--credit", "discounted:2", "discounted:x",
                                                "final", "--rollout", "--agents", "--min-reward", "nan",
                                                "--source", "metrics", "--out", "--metrics"])), max_size=6),
       command=st.sampled_from(READS))  # fmt: skip
def test_any_arguments(
    good_db: Path, args: list[str], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _digest(good_db)
    with tempfile.TemporaryDirectory() as tmp:
        out = [str(Path(tmp) / "o.jsonl")] if command == "export-sft" else []
        rest = [a for a in args if a not in ("--out", "--metrics")]  # keep writes inside tmp
        argv = [command, str(good_db), *out, *rest]
        code, err = _run(argv, capsys)
        assert code in (0, 2, 3), err
        if code:
            assert err.strip(), "an error says what went wrong"
    assert _digest(good_db) == before
