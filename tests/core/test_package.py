"""The public API: every contract name importable and documented with an example; a light import."""

from __future__ import annotations

import inspect
import subprocess
import sys

import agentlightning_lite as agl

CONTRACT = [
    "Span",
    "Rollout",
    "Transition",
    "MemoryStore",
    "SQLiteStore",
    "Tracer",
    "emit_reward",
    "emit_signal",
    "transitions",
    "credit",
    "air",
    "export_sft",
    "otel",
    "PolicyServer",
    "LLM",
    "engines",
    "models",
    "Trainer",
    "GRPO",
    "PPO",
    "LoRA",
    "LitAgent",
]


def test_contract_names_are_public_and_documented() -> None:
    for name in CONTRACT:
        obj = getattr(agl, name)
        assert name in agl.__all__
        doc = inspect.getdoc(obj) or ""
        assert doc, f"agl.{name} has no docstring"
        if not inspect.ismodule(obj):
            assert ">>>" in doc, f"agl.{name} has no example in its docstring"
    for name in (
        "credit.FinalReward",
        "credit.Discounted",
        "air.ToolStatus",
        "air.Rule",
        "otel.SpanProcessor",
        "engines.HFEngine",
        "engines.VLLMEngine",
        "engines.ScriptedEngine",
    ):
        mod, attr = name.split(".")
        assert ">>>" in (inspect.getdoc(getattr(getattr(agl, mod), attr)) or ""), name


def test_import_is_light() -> None:
    heavy = "('torch', 'starlette', 'transformers', 'peft')"
    code = f"import sys, agentlightning_lite; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _pyproject() -> dict:
    import pathlib

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = pathlib.Path(__file__).resolve().parents[2]
    return tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    import re

    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_each_extra_brings_what_its_documented_example_imports() -> None:
    """An extra installed alone runs its example (CI runs each in a fresh venv: noxfile.py); the
    packages those examples import beyond the extra's main one are listed here so a change shows."""
    project = _pyproject()["project"]
    extras = {k: _names(v) for k, v in project["optional-dependencies"].items()}
    # the README's training example: llm.openai_client() inside agl.Trainer's rollouts
    assert {"torch", "transformers", "peft", "starlette", "uvicorn", "openai"} <= extras["serve"]
    # an agent box: agl-lite runner (agentlightning_lite.remote imports its starlette routes), an agent
    # calling llm.openai_client()
    assert {"httpx", "openai", "starlette", "opentelemetry-proto"} <= extras["remote"]
    assert {"ray", "httpx", "openai", "starlette"} <= extras["ray"]
    # docs/adapters.md joins the frameworks' calls with a PolicyServer
    assert {"openai", "starlette", "uvicorn"} <= extras["adapters"]
    assert "uvloop" not in set().union(*extras.values())  # plain asyncio unless a framework brings it
    assert project["license"] == "MIT"  # an SPDX expression, not the deprecated table


def test_ci_checks_each_documented_extra_alone() -> None:
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    nox = (root / "noxfile.py").read_text(encoding="utf-8")
    sessions = set(re.findall(r'@nox\.session\(name="([\w-]+)"\)', nox))
    for extra in ("serve", "remote", "otel", "cli", "adapters"):
        assert f"extras-{extra}" in sessions
    for family in ("langchain", "openai-agents", "autogen", "crewai"):
        assert f"newest-{family}" in sessions
    ci = (root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert "set -euo pipefail" in ci and ci.index("make test") < ci.index("make envs")
    make = (root / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^envs: \$\(STAMP\)\n\t\$\(BIN\)/nox ", make, re.M)
