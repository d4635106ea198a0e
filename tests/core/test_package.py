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
