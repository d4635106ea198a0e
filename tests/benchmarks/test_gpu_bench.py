"""The GPU benchmark's CPU smoke run: tiny model, every measurement once, results files written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.gpu.bench import CPU_NOTE, GPU_SIZES, load_config, main


def test_the_configs_have_the_real_architectures_parameter_counts() -> None:
    import torch
    from transformers import AutoModelForCausalLM

    expected = {"llama-3.2-1b": 1.236e9, "llama-3.2-3b": 3.213e9, "qwen2.5-1.5b": 1.544e9}
    assert set(GPU_SIZES) == set(expected)
    for size, n in expected.items():
        with torch.device("meta"):  # shapes only: no memory
            model = AutoModelForCausalLM.from_config(load_config(size))
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(n, rel=1e-3), size


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_tiny_cpu_run_measures_everything_and_says_cpu_figures_are_not_gpu_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("the smoke run is the CPU one")
    results = main(["--tiny", "--in-process", "--no-trl", "--out-dir", str(tmp_path)])
    assert results is not None
    out = capsys.readouterr().out
    assert CPU_NOTE in out and "not quality" in out
    md = (tmp_path / "cpu_smoke_results.md").read_text()
    assert CPU_NOTE in md and "python -m benchmarks.gpu --tiny" in md
    data = json.loads((tmp_path / "cpu_smoke_results.json").read_text())
    assert data["device"] == "cpu" and data["environment"]["gpu"] == "none"
    tiny = data["sizes"]["tiny"]
    for c in data["settings"]["concurrency"]:
        assert tiny["decode"]["direct"][str(c)]["tok_s"] > 0
        assert tiny["decode"]["server"][str(c)]["tok_s"] > 0
    for ck in ("off", "on"):
        step = tiny[f"grpo_{ck}"]["steps"][-1]
        assert step["failed_rollouts"] == 0 and not step["skipped_update"]
        assert step["gen_s"] > 0 and step["update_s"] > 0 and step["tokens"] > 0
        assert tiny[f"trl_{ck}"] == {"skipped": "--no-trl"}
