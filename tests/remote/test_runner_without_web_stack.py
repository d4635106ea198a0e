"""An agent machine runs the runner without the server's web stack (starlette, uvicorn) installed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

import agentlightning_lite as agl

from .conftest import SRC

BLOCKED = "import sys\nfor m in ('starlette', 'uvicorn'): sys.modules[m] = None  # as if not installed\n"


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-c", BLOCKED + code], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_runner_side_imports_without_starlette() -> None:
    out = run_python(
        "from agentlightning_lite.remote import RemoteError, RemoteStore, Runner, RunnerClient, load_agent\n"
        "import agentlightning_lite.cli.runner\n"
        "print(sorted(m for m in sys.modules if m.startswith(('starlette', 'uvicorn')) and sys.modules[m]))\n"
        "try:\n"
        "    from agentlightning_lite.remote import RemoteRunners\n"
        "except ImportError:\n"
        "    print('RemoteRunners needs starlette')\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[]", "RemoteRunners needs starlette"]


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_agl_lite_runner_runs_a_rollout_without_starlette(
    served: Callable[..., agl.RemoteRunners], agent_file: str
) -> None:
    store = agl.MemoryStore()
    runners = served(store)
    result: list[subprocess.CompletedProcess[str]] = []
    args = ["runner", agent_file, "--server", runners.url, "--max-rollouts", "1", "--log-level", "warning"]
    code = f"from agentlightning_lite.cli import main\nsys.exit(main({args!r}))\n"
    t = threading.Thread(target=lambda: result.append(run_python(code)))
    t.start()
    (job,) = runners.run([({"q": "2+2?"}, "train", {})])
    t.join(120)
    assert result and result[0].returncode == 0, result[0].stderr if result else "the runner did not exit"
    assert (job.status, job.reward) == ("succeeded", 1.0)
    assert sorted(s.kind for s in store.spans(job.rollout_id)) == ["llm", "reward", "tool"]
