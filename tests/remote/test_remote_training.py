"""End to end: a trainer process and two ``agl-lite runner`` processes train an agent for 2 steps.

Real processes, real HTTP on 127.0.0.1, the embedded model: every rollout ends up in the trainer's
store with token-level transitions, and the LoRA weights are updated twice.
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

TRAINER = """
import json, logging, sys
import agentlightning_lite as agl

logging.basicConfig(level=logging.WARNING)
port, out = int(sys.argv[1]), sys.argv[2]
tasks = [{"q": f"Say something about the number {i}."} for i in range(4)]
trainer = agl.Trainer(
    model="smollm2-135m",
    engine="hf",
    engine_options={"num_threads": 1},
    algorithm=agl.GRPO(group_size=2, lr=5e-3),
    lora=agl.LoRA(r=4, alpha=8),
    batch_size=2,
    output_dir=out,
    loggers=[],
    runners=agl.RemoteRunners(port=port, api_key="test-key", lease_timeout=20.0),
)
metrics = trainer.fit("chatty", tasks, steps=2)
print(json.dumps({"step": trainer.step, "version": trainer.engine.version,
                  "rollouts": metrics.get("train/rollouts"), "samples": metrics.get("train/samples")}))
trainer.close()
"""

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


def test_two_cli_runners_train_an_agent_in_another_process(tmp_path: Path) -> None:
    (tmp_path / "trainer.py").write_text(textwrap.dedent(TRAINER))
    (tmp_path / "chatty.py").write_text(textwrap.dedent(AGENT))
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
    try:
        proc = subprocess.run(
            [sys.executable, str(tmp_path / "trainer.py"), str(port), str(tmp_path / "out")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        for r in runners:
            r.terminate()
        logs = [r.communicate(timeout=30)[0] for r in runners]
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["step"] == 2 and result["rollouts"] == 4.0 and result["version"] >= 2
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
