"""The real harness CLIs (Claude Code, Codex, opencode from npm), each sandboxed to loopback and the
server's port: every call of a run lands, with token ids, in that run's rollout; one GRPO step trains
on a harness's rollouts.

The CLIs come from ``tests/harness/install_clis.sh`` (pinned versions); without them, or without
network namespaces, these tests skip and say why.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.harness import claude_code, codex, opencode
from agentlightning_lite.rl.config import LoggingConfig, RolloutConfig, SampleConfig
from agentlightning_lite.serving import PolicyServer, engines

from .conftest import cli, needs_isolation

pytestmark = [pytest.mark.harness, pytest.mark.slow]

#: short prompts and few tools: the embedded model has an 8192-token context
SHORT = "You are a coding agent. Use the tools when needed; answer briefly."


def recipes() -> dict[str, Callable[..., agl.CommandAgent]]:
    return {
        "opencode": lambda **kw: opencode(
            executable=cli("opencode"), system_prompt=SHORT, tools=["bash", "read", "write", "edit"], **kw
        ),
        "codex": lambda **kw: codex(executable=cli("codex"), instructions=SHORT, **kw),
        "claude-code": lambda **kw: claude_code(executable=cli("claude"), **kw),
    }


@pytest.fixture
def scripted() -> Iterator[PolicyServer]:
    with PolicyServer(engines.ScriptedEngine(["Done."] * 8), agl.MemoryStore()) as server:
        yield server


def run_once(server: PolicyServer, agent: agl.CommandAgent, task: str) -> tuple[float | None, str]:
    tracer = agl.Tracer(server.store)
    with tracer.rollout(task) as ro:
        reward = agent(task, server.llm(ro.id))
        if reward is not None:
            ro.reward(reward)
    return reward, ro.id


@pytest.mark.parametrize("name", ["opencode", "codex", "claude-code"])
def test_every_call_of_a_harness_run_lands_in_its_rollout_with_token_ids(
    scripted: PolicyServer, name: str
) -> None:
    needs_isolation()
    make = recipes()[name]
    title = {"title": None} if name == "opencode" else {}  # opencode's title call: a side call
    agent = make(timeout=120, **title)
    runs = [run_once(scripted, agent, f"Say hello ({i}).") for i in range(2)]
    api = {"opencode": "chat.completions", "codex": "responses", "claude-code": "messages"}[name]
    for reward, rid in runs:
        spans = scripted.store.spans(rid)
        (harness,) = [s for s in spans if s.name == "harness"]
        assert reward == 1.0 and harness.output["exit_code"] == 0, harness.output
        assert "Done." in harness.output["stdout"]
        llm = [s for s in spans if s.kind == "llm"]
        main = [s for s in llm if s.agent is None]
        assert main and all(s.attributes["api"] == api for s in main)
        assert all(s.rollout_id == rid and s.prompt_token_ids and s.response_token_ids for s in llm)
        side = [s for s in llm if s.agent == "side"]
        assert len(side) == (1 if name == "opencode" else 0)
        trained = agl.transitions(scripted.store, rollout_ids=[rid])
        assert len(trained) == len(main)  # side calls recorded, not trained
    # nothing landed outside the two rollouts (no implicit rollout of an unrouted call)
    assert {r.rollout_id for r in scripted.store.rollouts()} == {rid for _, rid in runs}


def test_one_grpo_step_on_opencode_rollouts(tmp_path: Path, tiny_smol: Path) -> None:
    """The policy is the tiny Llama with SmolLM2's tokenizer and chat template (the same prompts and token
    ids as the embedded model's): what is checked is the plumbing, not what the model answers."""
    needs_isolation()
    pytest.importorskip("peft")
    # one tool: a prompt of about 1 k tokens, not 3 k (the update's cost on a CPU grows with it)
    agent = opencode(
        executable=cli("opencode"),
        system_prompt=SHORT,
        tools=["write"],
        max_output=16,
        timeout=600,
        reward=_reward,
    )
    trainer = agl.Trainer(
        model=str(tiny_smol),
        engine="hf",
        algorithm=agl.GRPO(group_size=2, lr=1e-4),
        lora=agl.LoRA(r=2, alpha=4),
        store=agl.SQLiteStore(tmp_path / "runs.db"),
        output_dir=tmp_path,
        batch_size=1,
        sample_config=SampleConfig(max_seq_len=2048),
        rollout_config=RolloutConfig(timeout=700),
        logging_config=LoggingConfig(loggers=[]),
    )
    with trainer:
        trainer.fit(agent, ["Write hello to a file named hi.txt."], steps=1)
        store = trainer.store
        rollouts = store.rollouts(mode="train")
        assert len(rollouts) == 2 and all(r.status == "succeeded" for r in rollouts)
        for ro in rollouts:
            spans = store.spans(ro.rollout_id)
            (harness,) = [s for s in spans if s.kind == "agent"]
            llm = [s for s in spans if s.kind == "llm"]
            assert llm, harness.output  # opencode's calls reached the trainer's server, in this rollout
            assert all(s.prompt_token_ids and s.response_token_ids for s in llm)
        trained = agl.transitions(store, rollout_ids=[r.rollout_id for r in rollouts])
        assert trained and all(t.prompt_token_ids and t.response_token_ids for t in trained)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "train/samples" in r]
    assert steps and steps[-1]["train/samples"] == len(trained), rows
    assert steps[-1]["diag/policy_calls"] >= 2


def _reward(result: Any) -> float:
    """A reward with spread in a group: the length of the answer, capped (the plumbing, not a task)."""
    return min(len(result.stdout.strip()), 200) / 200.0
