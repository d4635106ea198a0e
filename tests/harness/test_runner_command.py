"""``agl-lite runner --command``: a program per rollout for a remote trainer, its calls in that rollout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import build_parser
from agentlightning_lite.cli._common import CLIError
from agentlightning_lite.cli.runner import _agent_of
from agentlightning_lite.harness import sandbox

from ..remote.conftest import SRC, served  # noqa: F401  (the fixture)

FAKE = str(Path(__file__).with_name("fake_harness.py"))


def test_runner_command_runs_the_program_once_per_rollout_with_its_calls_in_it(
    served: Callable[..., agl.RemoteRunners],  # noqa: F811
) -> None:
    store = agl.MemoryStore()
    runners = served(store, api_key="k")
    network = "isolated" if sandbox.isolation_available() is None else "host"
    command = f"{sys.executable} {FAKE} calls,env {{task}}"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agentlightning_lite.cli",
            "runner",
            "--command",
            command,
            "--server",
            runners.url,
            "--api-key",
            "k",
            "--network",
            network,
            "--max-rollouts",
            "2",
            "--timeout",
            "60",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    done: list[list[object]] = []
    worker = threading.Thread(
        target=lambda: done.append(runners.run([("q0", "train", {}), ("q1", "train", {})])), daemon=True
    )
    worker.start()
    try:
        out, _ = proc.communicate(timeout=120)
        worker.join(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and done, out
    jobs: list = done[0]  # type: ignore[type-arg]
    assert [(j.status, j.reward) for j in jobs] == [("succeeded", 1.0)] * 2
    for j in jobs:
        spans = store.spans(j.rollout_id)
        llm = [s for s in spans if s.kind == "llm"]
        assert [s.agent for s in llm] == ["side", None, None]
        assert all(s.response_token_ids for s in llm)
        assert [s.name for s in spans if s.kind == "agent"] == ["harness"]
        assert len(agl.transitions(store, rollout_ids=[j.rollout_id])) == 2  # the side call is not trained
        (harness,) = [s for s in spans if s.name == "harness"]
        env = json.loads(harness.output["stdout"])["env"]
        assert env["OPENAI_API_KEY"].startswith("agl-rk-")  # the rollout's own key, not the trainer's
        assert "/lease/" in env["OPENAI_BASE_URL"] and env["AGL_ROLLOUT_ID"] == j.rollout_id


def test_runner_arguments_name_exactly_one_agent() -> None:
    parser = build_parser()
    args = parser.parse_args(["runner", "--command", "echo {task}", "--network", "host"])
    assert args.command == "runner" and args.run_command == "echo {task}"
    from agentlightning_lite.remote.worker import load_agent

    agent = _agent_of(args, load_agent)
    assert isinstance(agent, agl.CommandAgent) and agent.command == ["echo", "{task}"]
    recipe = _agent_of(
        parser.parse_args(["runner", "--harness", "codex", "--executable", "/x/codex"]), load_agent
    )
    assert recipe.command[:2] == ["/x/codex", "exec"] and recipe.network == "isolated"
    with pytest.raises(CLIError, match="exactly one"):
        _agent_of(parser.parse_args(["runner", "m:agent", "--command", "x"]), load_agent)
    with pytest.raises(CLIError, match="exactly one"):
        _agent_of(parser.parse_args(["runner"]), load_agent)
