"""The names this feature adds to the public API: importable, documented with an example, light."""

from __future__ import annotations

import inspect
import subprocess
import sys

import agentlightning_lite as agl


def test_new_names_are_public_and_documented() -> None:
    for name in ("RemoteRunners", "RayRunners", "remote"):
        assert name in agl.__all__
        assert inspect.getdoc(getattr(agl, name))
    for obj in (
        agl.RemoteRunners,
        agl.RayRunners,
        agl.remote.Runner,
        agl.remote.RemoteStore,
        agl.remote.RunnerClient,
        agl.remote.RolloutQueue,
    ):
        assert ">>>" in (inspect.getdoc(obj) or ""), obj


def test_a_runner_imports_no_training_stack() -> None:
    code = (
        "import sys; import agentlightning_lite.remote.worker; "
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_runner_parses() -> None:
    from agentlightning_lite.cli import build_parser

    args = build_parser().parse_args(["runner", "m:agent", "--server", "http://h:1", "--workers", "3"])
    assert (args.command, args.agent, args.server, args.workers) == ("runner", "m:agent", "http://h:1", 3)


def test_cli_train_runners_takes_host_and_port(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from agentlightning_lite.cli import build_parser, main

    args = build_parser().parse_args(["train", "m:agent", "--runners", "0.0.0.0:8765", "--api-key", "k"])
    assert (args.runners, args.api_key) == ("0.0.0.0:8765", "k")
    agent = tmp_path / "a.py"
    agent.write_text("def agent(task, llm):\n    return 1.0\n")
    data = tmp_path / "t.jsonl"
    data.write_text('{"q": 1}\n')
    assert main(["train", f"{agent}:agent", "--data", str(data), "--runners", "somewhere"]) == 2
    assert "--runners takes [HOST:]PORT" in capsys.readouterr().err
