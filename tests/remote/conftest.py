"""Fixtures for the remote-runner tests: a served rollout queue (scripted engine) and agent files."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.engines import ScriptedEngine

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.fixture
def served() -> Iterator[Callable[..., agl.RemoteRunners]]:
    """Start ``RemoteRunners`` (scripted engine, memory store) on a free port; stopped after the test."""
    started: list[agl.RemoteRunners] = []

    def start(store: Any = None, rollout_timeout: float | None = None, **kw: Any) -> agl.RemoteRunners:
        kw.setdefault("port", 0)
        runners = agl.RemoteRunners(**kw)
        engine = ScriptedEngine(["The answer is 4."], tokenizer="bytes")
        runners.serve(engine, store if store is not None else agl.MemoryStore(), rollout_timeout)
        started.append(runners)
        return runners

    yield start
    for r in started:
        server = r.server
        r.stop()
        if server is not None:
            server.stop()


AGENT_CODE = '''
import os, time
import agentlightning_lite as agl

def agent(task, llm):
    """Asks the policy once, sleeps ``task["sleep"]`` seconds (a slow tool), rewards a '4'."""
    with agl.Tracer.current_rollout().tracer.span("tool", "sleepy", input=task) as sp:
        time.sleep(float(task.get("sleep", 0)))
        sp.set_output("slept")
    reply = llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model, messages=[{"role": "user", "content": task["q"]}])
    return 1.0 if "4" in (reply.choices[0].message.content or "") else 0.0
'''


@pytest.fixture
def agent_file(tmp_path: Path) -> str:
    """A file with a small agent: ``path/to/agents.py:agent``."""
    path = tmp_path / "agents.py"
    path.write_text(textwrap.dedent(AGENT_CODE))
    return f"{path}:agent"


def start_runner(server: str, agent: str, *extra: str, api_key: str | None = None) -> subprocess.Popen:
    """``agl-lite runner AGENT --server URL ...`` in a subprocess (its own process group)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "agentlightning_lite.cli", "runner", agent, "--server", server]
    if api_key:
        cmd += ["--api-key", api_key]
    return subprocess.Popen(
        [*cmd, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
