"""The JavaScript agent under examples/js_agent, trained for one step by the Python trainer.

Node.js runs the agent with the stock ``openai`` package and OpenTelemetry's OTLP/HTTP exporter
(installed from the npm registry into a temporary copy of the example): its LLM calls carry token
ids, its tool span reaches the store through ``/v1/traces``, and its reward is recorded.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig

pytestmark = pytest.mark.slow

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "js_agent"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def js_agent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("node") is None:
        pytest.skip("Node.js (`node`) is not installed: the JavaScript example cannot run")
    npm = shutil.which("npm")
    assert npm is not None, "node is installed but npm is not"
    where = tmp_path_factory.mktemp("js_agent")
    for name in ("package.json", "agent.mjs"):
        shutil.copy(EXAMPLE / name, where / name)
    proc = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund"], cwd=where, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return where


def test_the_js_agent_is_trained_for_one_step(js_agent: Path, tmp_path: Path, tiny_smol: Path) -> None:
    """The policy is the tiny Llama with SmolLM2's tokenizer: what is checked is the plumbing (spans over
    OTLP from Node.js, token ids, rewards, one update), not what the model answers."""
    port = free_port()
    key = "js-key"
    env = {
        **os.environ,
        "AGL_SERVER": f"http://127.0.0.1:{port}",
        "AGL_API_KEY": key,
        "AGL_WORKER": "node-1",
        "AGL_MAX_ROLLOUTS": "4",
    }
    node = subprocess.Popen(
        ["node", "agent.mjs"],
        cwd=js_agent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    tasks = [{"a": 2, "b": 2}, {"a": 3, "b": 4}]
    try:
        with agl.Trainer(
            model=str(tiny_smol),
            engine="hf",
            engine_options={"num_threads": 1},
            algorithm=agl.GRPO(group_size=2, lr=5e-3),
            lora=agl.LoRA(r=4, alpha=8),
            batch_size=2,
            output_dir=tmp_path,
            logging_config=LoggingConfig(loggers=[]),
            runners=agl.RemoteRunners(port=port, api_key=key),
        ) as trainer:
            metrics = trainer.fit("js-calculator", tasks, steps=1)
            store = trainer.store
            ros = store.rollouts(mode="train")
            spans = {r.rollout_id: store.spans(r.rollout_id) for r in ros}
            ts = agl.transitions(store, rollout_ids=list(spans))
    finally:
        out = node.communicate(timeout=60)[0]
    assert node.returncode == 0, out
    assert trainer.step == 1 and metrics["train/rollouts"] == 4.0, metrics
    assert len(ros) == 4 and all(r.status == "succeeded" and r.reward is not None for r in ros), out
    assert all(r.metadata["worker"] == "node-1" for r in ros)
    for rid, sps in spans.items():
        kinds = {s.kind: s for s in sps}
        assert kinds["llm"].has_tokens, rid  # the policy call, recorded by the server with token ids
        tool = kinds["tool"]  # the JS tool span, through OTLP/HTTP
        assert tool.name == "calculator" and tool.input == {"a": tool.input["a"], "b": tool.input["b"]}
        assert int(tool.output) == tool.input["a"] + tool.input["b"]
    assert len(ts) == 4 and all(t.response_token_ids and t.reward is not None for t in ts)
