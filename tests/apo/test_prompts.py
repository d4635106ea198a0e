"""agl.prompt: the text of the rollout (its metadata), the default elsewhere, one recorded read per rollout,
the same text for an agent run by a remote runner; prompts files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.prompts import PROMPT_SPAN
from agentlightning_lite.remote import Runner
from agentlightning_lite.serving.engines import ScriptedEngine


def test_a_rollout_reads_its_own_text_and_the_default_elsewhere() -> None:
    tracer = agl.Tracer()
    given = {"writer/system": "Write in digits.", "system": "Top level."}
    with tracer.rollout("t", metadata={"prompts": given}) as ro:
        assert agl.prompt("system", default="d", agent="writer") == "Write in digits."
        assert agl.prompt("system", default="d", agent="writer") == "Write in digits."  # read twice
        assert agl.prompt("system") == "Top level."
        assert agl.prompt("system", default="Rewrite.", agent="rewriter") == "Rewrite."
        llm = agl.LLM(base_url="http://127.0.0.1:1/rollout/x/v1", model="m", rollout_id="x")
        assert llm.for_agent("writer").prompt("system", "d") == "Write in digits."
        assert llm.prompt("system") == "Top level."
    with tracer.rollout("u") as other:
        assert agl.prompt("system", default="d", agent="writer") == "d"
        with pytest.raises(KeyError, match="no prompt 'writer/style'"):
            agl.prompt("style", agent="writer")
    assert agl.prompt("system", default="outside", agent="writer") == "outside"
    reads = [s for s in tracer.store.spans(ro.id) if s.name == PROMPT_SPAN]
    # one span per component read, whatever the number of reads
    assert [(s.kind, s.attributes["component"], s.attributes["source"], s.output) for s in reads] == [
        ("custom", "writer/system", "given", "Write in digits."),
        ("custom", "system", "given", "Top level."),
        ("custom", "rewriter/system", "default", "Rewrite."),
    ]
    [read] = [s for s in tracer.store.spans(other.id) if s.name == PROMPT_SPAN]
    assert read.attributes["default"] == "d" and read.attributes["source"] == "default"


def test_bad_names_are_refused() -> None:
    with pytest.raises(ValueError, match="without '/'"):
        agl.prompt("a/b", default="x")
    with pytest.raises(ValueError, match="agent name"):
        agl.prompt("system", default="x", agent="")


def test_prompts_files_load_from_a_file_a_directory_or_a_mapping(tmp_path: Path) -> None:
    from agentlightning_lite.apo import save_prompts

    save_prompts(tmp_path / "prompts.json", {"writer/system": "A."}, val_score=0.5)
    assert json.loads((tmp_path / "prompts.json").read_text())["val_score"] == 0.5
    assert (
        agl.load_prompts(tmp_path) == agl.load_prompts(tmp_path / "prompts.json") == {"writer/system": "A."}
    )
    (tmp_path / "flat.json").write_text(json.dumps({"system": "B."}))
    assert agl.load_prompts(tmp_path / "flat.json") == {"system": "B."}
    (tmp_path / "bad.json").write_text(json.dumps({"system": 3}))
    with pytest.raises(ValueError, match="map component names to texts"):
        agl.load_prompts(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError, match="no prompts file"):
        agl.load_prompts(tmp_path / "missing.json")


def test_a_remote_runner_reads_the_prompts_of_its_rollout() -> None:
    store = agl.MemoryStore()
    runners = agl.RemoteRunners(port=0)
    runners.serve(ScriptedEngine(["ok"], tokenizer="bytes"), store, None)

    def agent(task: str, llm: agl.LLM) -> float:
        return float(llm.for_agent("writer").prompt("system", default="default") == task)

    try:
        with Runner(agent, runners.url, workers=2):
            jobs = runners.run(
                [
                    ("Use digits.", "train", {"prompts": {"writer/system": "Use digits."}}),
                    ("default", "val", {}),
                    ("Use digits.", "train", {}),
                ]
            )
    finally:
        server = runners.server
        runners.stop()
        server.stop()
    assert [(j.status, j.reward) for j in jobs] == [
        ("succeeded", 1.0),
        ("succeeded", 1.0),
        ("succeeded", 0.0),
    ]
    reads = [s for s in store.spans(jobs[0].rollout_id) if s.name == PROMPT_SPAN]
    assert [(s.attributes["component"], s.output) for s in reads] == [("writer/system", "Use digits.")]
