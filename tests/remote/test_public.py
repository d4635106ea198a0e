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
        "import sys; import agentlightning_lite.remote.runner; "
        "print(sorted(m for m in ('torch', 'transformers', 'peft', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_cli_runner_parses() -> None:
    from agentlightning_lite.cli import build_parser

    args = build_parser().parse_args(["runner", "m:agent", "--server", "http://h:1", "--workers", "3"])
    assert (args.command, args.agent, args.server, args.workers) == ("runner", "m:agent", "http://h:1", 3)
