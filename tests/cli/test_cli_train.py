"""``agl-lite train``: a user's agent file and dataset file, trained for real on the embedded model."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import load_agent, load_tasks, main

AGENT = textwrap.dedent(
    '''
    """A user's agent: one call to the policy; rewards replies that use many different characters."""


    def agent(task, llm):
        client = llm.openai_client(max_retries=0)
        reply = client.chat.completions.create(
            model=llm.model, max_tokens=6, temperature=1.0,
            messages=[{"role": "user", "content": task["q"]}],
        ).choices[0].message.content or ""
        return len(set(reply)) / 12.0
    '''
)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_agent.py").write_text(AGENT)
    (tmp_path / "train.jsonl").write_text(
        "".join(json.dumps({"q": f"Name a color ({i})."}) + "\n" for i in range(3))
    )
    (tmp_path / "val.json").write_text(json.dumps([{"q": "Name a fruit."}, {"q": "Name a city."}]))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_load_agent_and_tasks(project: Path) -> None:
    agent, module = load_agent("my_agent:agent")
    assert callable(agent) and module.__name__ == "my_agent"
    agent2, _ = load_agent(str(project / "my_agent.py") + ":agent")
    assert callable(agent2)
    assert load_tasks(project / "train.jsonl", limit=2) == [
        {"q": "Name a color (0)."},
        {"q": "Name a color (1)."},
    ]
    assert load_tasks(project / "val.json")[1] == {"q": "Name a city."}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["my_agent:agent", "--data", "missing.jsonl"], "no such file: missing.jsonl"),
        (["no_such_module:agent", "--data", "train.jsonl"], "cannot import 'no_such_module'"),
        (["my_agent:nothing", "--data", "train.jsonl"], "'my_agent' has no attribute 'nothing'"),
        (["my_agent:agent"], "--data FILE is required"),
        (["my_agent:agent", "--data", "empty.jsonl"], "empty.jsonl holds no tasks"),
        (["my_agent:agent", "--data", "broken.jsonl"], "broken.jsonl is neither JSONL nor a JSON list"),
        (["my_agent:agent", "--data", "train.jsonl", "--steps", "0"], "--steps must be >= 1"),
        (
            ["my_agent:agent", "--data", "train.jsonl", "--tool-call-parser", "qwen4"],
            "--tool-call-parser 'qwen4'",
        ),
        (
            ["my_agent:agent", "--data", "train.jsonl", "--reasoning-parser", "r1"],
            "--reasoning-parser 'r1': one of",
        ),
    ],
)
def test_train_usage_errors_exit_2(
    project: Path, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (project / "empty.jsonl").write_text("\n")
    (project / "broken.jsonl").write_text('{"q": 1}\n{not json\n')
    code = main(["train", *argv, "--output-dir", str(project / "out")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err and err.startswith("agl-lite: error:")
    assert not (project / "out").exists()  # nothing was started


@pytest.mark.slow
def test_train_a_user_agent_for_one_step(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = project / "out"
    code = main(
        [
            "train", "my_agent:agent", "--data", "train.jsonl", "--val-data", "val.json",
            "--steps", "1", "--batch-size", "2", "--group-size", "2", "--lr", "1e-4", "--lora-r", "4",
            "--engine", "hf", "--concurrency", "4", "--output-dir", str(out_dir), "--json",
            "--tool-call-parser", "hermes", "--reasoning-parser", "none",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out)
    assert result["steps"] == 1 and result["train_tasks"] == 3
    assert result["before"]["n"] == 2 and result["after"]["n"] == 2
    assert result["last_metrics"]["train/rollouts"] == 4.0
    assert (out_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert [json.loads(x)["step"] for x in (out_dir / "metrics.jsonl").read_text().splitlines()] == [1]
    assert (out_dir / "reward_curve.png").stat().st_size > 1000

    # the run's store is readable by the other commands: 4 train rollouts, 2 + 2 validation ones
    assert main(["runs", str(out_dir / "runs.db"), "--json"]) == 0
    items = json.loads(capsys.readouterr().out)
    assert sorted(i["mode"] for i in items) == ["train"] * 4 + ["val"] * 4
    assert all(i["status"] == "succeeded" and i["llm_calls"] == 1 for i in items)
    assert (
        main(["transitions", str(out_dir / "runs.db"), "--mode", "train", "--require-tokens", "--json"]) == 0
    )
    ts = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert len(ts) == 4 and all(t["response_token_ids"] for t in ts)
    # the parser flags reached the trainer's PolicyServer: every call was read with them
    with agl.SQLiteStore(out_dir / "runs.db") as store:
        llm_spans = [s for r in store.rollouts() for s in store.spans(r.rollout_id) if s.kind == "llm"]
    assert len(llm_spans) == 8
    assert {(s.attributes["tool_parser"], s.attributes["reasoning_parser"]) for s in llm_spans} == {
        ("hermes", None)
    }
