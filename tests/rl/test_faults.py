"""Trainer faults on a tiny random-init model (fast on CPU): resuming over rollouts a killed process
left running, agents that hang past their timeout, a single AIR rule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving.tokenizer import ByteTokenizer

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")

SRC = str(Path(agl.__file__).resolve().parents[1])


def tiny_engine(**kw: Any) -> Any:
    """An HFEngine over a one-layer random Llama with the byte tokenizer (258 tokens)."""
    from agentlightning_lite.serving.engines import HFEngine

    tok = ByteTokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    options: dict[str, Any] = dict(lora=agl.LoRA(r=2, alpha=4), model_name="tiny", seed=0, num_threads=1)
    options.update(kw)
    return HFEngine(model, tokenizer=tok, **options)


@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    eng = tiny_engine()
    yield eng
    eng.close()


def make(engine: Any, tmp_path: Path, **kw: Any) -> agl.Trainer:
    defaults: dict[str, Any] = dict(algorithm=agl.GRPO(group_size=2, lr=1e-3), batch_size=2, loggers=[])
    defaults.update(kw)
    return agl.Trainer(
        engine=engine, store=agl.SQLiteStore(tmp_path / "runs.db"), output_dir=tmp_path, **defaults
    )


CHILD = """
import sys, time
import agentlightning_lite as agl
store = agl.SQLiteStore(sys.argv[1], flush_interval=0.05)
ids = [store.start_rollout({"q": i}, mode="train").rollout_id for i in range(3)]
store.flush()
print(" ".join(ids), flush=True)
time.sleep(600)
"""


def test_resume_marks_rollouts_of_a_killed_trainer_interrupted(engine: Any, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path / "runs.db")], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        left = proc.stdout.readline().split()  # type: ignore[union-attr]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()  # type: ignore[union-attr]
    assert len(left) == 3

    trainer = make(engine, tmp_path)
    try:
        assert all(trainer.store.get_rollout(rid).status == "running" for rid in left)  # type: ignore[union-attr]
        trainer.fit(lambda task, llm: 1.0, [{"q": 0}], steps=0)  # no resume: left as they are
        assert all(trainer.store.get_rollout(rid).status == "running" for rid in left)  # type: ignore[union-attr]
        trainer.fit(lambda task, llm: 1.0, [{"q": 0}], steps=0, resume=True)
        got = [trainer.store.get_rollout(rid) for rid in left]
        assert [(r.status, r.error) for r in got] == [("failed", "interrupted")] * 3  # type: ignore[union-attr]
    finally:
        trainer.close()


def test_trainer_takes_a_single_air_rule(engine: Any, tmp_path: Path) -> None:
    rule = agl.air.ToolStatus(success=0.5)
    trainer = make(engine, tmp_path, air=rule)
    try:
        assert trainer.air == [rule]
        with pytest.raises(TypeError, match="air= rule 0 is a str"):
            make(engine, tmp_path, air=["not a rule"])
    finally:
        trainer.close()
