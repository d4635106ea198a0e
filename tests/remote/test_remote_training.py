"""End to end: ``agl-lite train --runners`` and two ``agl-lite runner`` processes train an agent, 2 steps.

Real processes, real HTTP on 127.0.0.1, a real model (the tiny Llama on SmolLM2's tokenizer and chat
template, loaded by path as a user's model is): every rollout ends up in the trainer's store with
token-level transitions, and the LoRA weights are updated twice.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import agentlightning_lite as agl

from .conftest import SRC, start_runner

pytestmark = pytest.mark.slow

KEY = "test-key"

AGENT = '''
def agent(task, llm):
    """Rewards longer, more varied replies: a reward with spread, so GRPO has a gradient."""
    reply = llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model, max_tokens=8, temperature=1.0,
        messages=[{"role": "user", "content": task["q"]}])
    return len(set(reply.choices[0].message.content or "")) / 16.0
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_cli_runners_train_an_agent_in_another_process(tmp_path: Path, tiny_smol: Path) -> None:
    (tmp_path / "chatty.py").write_text(textwrap.dedent(AGENT))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"q": f"Say something about the number {i}."}) + "\n" for i in range(4))
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # the runners start first: they wait for the trainer and connect when it is up
    runners = [
        start_runner(
            url, f"{tmp_path / 'chatty.py'}:agent", "--workers", "2", "--worker-id", f"r{i}", api_key=KEY
        )
        for i in range(2)
    ]
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    trainer = [sys.executable, "-m", "agentlightning_lite.cli", "train", f"{tmp_path / 'chatty.py'}:agent",
               "--data", str(tasks), "--steps", "2", "--batch-size", "2", "--group-size", "2", "--lr", "5e-3",
               "--lora-r", "4", "--engine", "hf", "--model", str(tiny_smol), "--runners", f"127.0.0.1:{port}",
               "--api-key", KEY,
               "--output-dir", str(tmp_path / "out"), "--json"]  # fmt: skip
    try:
        proc = subprocess.run(trainer, env=env, capture_output=True, text=True, timeout=300)
    finally:
        for r in runners:
            r.terminate()
        logs = [r.communicate(timeout=30)[0] for r in runners]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["steps"] == 2 and result["last_metrics"]["train/rollouts"] == 4.0
    assert all(r.returncode == 0 for r in runners), logs
    with agl.SQLiteStore(tmp_path / "out" / "runs.db") as store:
        ros = store.rollouts(mode="train")
        assert len(ros) == 8 and all(r.status == "succeeded" and r.reward is not None for r in ros)
        assert {r.metadata["worker"].split("/")[0] for r in ros} == {"r0", "r1"}  # both runners worked
        assert sorted(
            (r.metadata["step"], r.metadata["task_index"], r.metadata["sample"]) for r in ros
        ) == sorted({(r.metadata["step"], r.metadata["task_index"], r.metadata["sample"]) for r in ros})
        ts = agl.transitions(store, rollout_ids=[r.rollout_id for r in ros])
        assert len(ts) == 8
        assert all(t.prompt_token_ids and t.response_token_ids and t.response_logprobs for t in ts)
        assert {t.metadata["weights_version"] for t in ts} == {
            0,
            1,
        }  # step 1 sampled from the updated adapter
