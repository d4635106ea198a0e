"""tinker-cookbook (0.6.1) recipes, unchanged, against the server: ``recipes/chat_sl/train.py`` on the
conversations file its wheel ships and ``recipes/math_rl/train.py env=arithmetic
loss_fn=importance_sampling``, two steps each, offline.

The recipes run in a Python that has the cookbook: this one when ``import tinker_cookbook`` works
(``nox -s tinker``), else the interpreter named by ``$AGL_TINKER_COOKBOOK_PYTHON`` (a virtualenv with
``pip install tinker==0.38.0`` and ``tinker-cookbook==0.6.1``: docs/tinker.md); without either the tests
are skipped. The recipes name the model by the tiny model's directory (``model_name=DIR``): it is what the
server accepts as ``base_model`` and what the cookbook's ``get_tokenizer`` loads offline.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentlightning_lite.tinker import TinkerServer, build_backend


def cookbook_python() -> str | None:
    """A Python that has tinker-cookbook: this one, else ``$AGL_TINKER_COOKBOOK_PYTHON``; ``None``
    without either."""
    if importlib.util.find_spec("tinker_cookbook") is not None:
        return sys.executable
    return os.environ.get("AGL_TINKER_COOKBOOK_PYTHON") or None


COOKBOOK_PYTHON = cookbook_python()
if COOKBOOK_PYTHON is None:
    pytest.skip(
        "tinker-cookbook is not installed here: run `nox -s tinker`, or set AGL_TINKER_COOKBOOK_PYTHON to a "
        "Python with `pip install tinker==0.38.0 tinker-cookbook==0.6.1` (docs/tinker.md)",
        allow_module_level=True,
    )

KEY = "tml-cookbook-test"


@pytest.fixture(scope="module")
def server(tiny_smol: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinkerServer]:
    backend = build_backend(str(tiny_smol), num_threads=1, seed=0)
    out = tmp_path_factory.mktemp("tinker-cookbook")
    srv = TinkerServer(backend, out, api_key=KEY, poll_s=5.0).start()
    yield srv
    srv.close()


def run_recipe(module: str, args: list[str], log_path: Path, timeout: float = 600) -> list[dict[str, Any]]:
    """Run ``python -m tinker_cookbook.recipes.<module>`` with ``args`` (offline); the rows of its
    ``metrics.jsonl``."""
    env = {
        **os.environ,
        "TINKER_API_KEY": KEY,
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    env.pop("TINKER_BASE_URL", None)
    cmd = [str(COOKBOOK_PYTHON), "-m", f"tinker_cookbook.recipes.{module}", *args]
    cmd += [f"log_path={log_path}", "behavior_if_log_dir_exists=delete"]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env, stdin=subprocess.DEVNULL
    )
    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-5000:]}"
    assert proc.returncode == 0, tail
    assert "Training completed successfully" in proc.stdout + proc.stderr, tail
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]


def shipped_conversations() -> Path:
    """The conversations file in the cookbook's wheel (``tinker_cookbook/example_data``)."""
    code = "import pathlib, tinker_cookbook; print(pathlib.Path(tinker_cookbook.__file__).parent)"
    out = subprocess.run([str(COOKBOOK_PYTHON), "-c", code], capture_output=True, text=True, check=True)
    path = Path(out.stdout.strip()) / "example_data" / "conversations.jsonl"
    assert path.is_file(), path
    return path


def test_chat_sl_recipe_trains_and_its_loss_goes_down(
    server: TinkerServer, tiny_smol: Path, tmp_path: Path
) -> None:
    # the first two conversations of the shipped file, one batch of two, two epochs: the second step
    # sees the same batch after one update, so its NLL must be lower
    lines = shipped_conversations().read_text().splitlines()[:2]
    data = tmp_path / "two.jsonl"
    data.write_text("\n".join(lines) + "\n")
    args = [
        f"model_name={tiny_smol}",
        "renderer_name=qwen3_instruct",
        f"dataset={data}",
        f"base_url={server.url}",
        "batch_size=2",
        "num_epochs=2",
        "lora_rank=4",
        "learning_rate=0.01",
        "max_length=128",
    ]
    rows = [r for r in run_recipe("chat_sl.train", args, tmp_path / "log") if "train_mean_nll" in r]
    assert [r["step"] for r in rows] == [0, 1], rows
    nll = [r["train_mean_nll"] for r in rows]
    assert all(math.isfinite(x) for x in nll) and nll[1] < nll[0], nll
    saved = [json.loads(x) for x in (tmp_path / "log" / "checkpoints.jsonl").read_text().splitlines()]
    assert saved[-1]["state_path"].startswith("tinker://") and saved[-1]["sampler_path"].endswith("/final")


def test_math_rl_recipe_samples_scores_and_trains_with_importance_sampling(
    server: TinkerServer, tiny_smol: Path, tmp_path: Path
) -> None:
    args = [
        "env=arithmetic",
        "loss_fn=importance_sampling",
        f"model_name={tiny_smol}",
        "renderer_name=qwen3_instruct",
        f"base_url={server.url}",
        "groups_per_batch=2",
        "group_size=2",
        "max_tokens=4",
        "max_steps=2",
        "lora_rank=4",
    ]
    # the training steps' rows (a last row after them holds the cumulative token counts)
    rows = [r for r in run_recipe("math_rl.train", args, tmp_path / "log") if "env/all/total_episodes" in r]
    assert [r["step"] for r in rows] == [0, 1], rows
    for row in rows:
        assert row["env/all/total_episodes"] == 4, row  # 2 groups of 2 samples, each scored
        assert math.isfinite(row["env/all/reward/total"]), row
        assert 0 < row["env/all/total_ac_tokens"] <= 4 * 4, row
        # the sampler's logprobs and the trainer's agree: same weights, exact tokens
        assert abs(row["optim/kl_sample_train_v1"]) < 1e-2, row
        assert math.isfinite(row["optim/entropy"]) and row["optim/entropy"] > 0, row
        # the random tiny model writes no answer in the format, so every group is all-bad: no spread, no
        # advantage, a zero gradient (the 135M model's run in docs/tinker.md has mixed groups)
        groups = [row[f"env/all/by_group/frac_{k}"] for k in ("mixed", "all_good", "all_bad")]
        assert math.isclose(sum(groups), 1.0), row
        assert math.isfinite(row["grad_norm"]) and row["grad_norm"] >= 0, row
    saved = [json.loads(x) for x in (tmp_path / "log" / "checkpoints.jsonl").read_text().splitlines()]
    assert saved[-1]["sampler_path"].startswith("tinker://") and saved[-1]["sampler_path"].endswith("/final")
