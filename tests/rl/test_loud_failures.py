"""Silent failures made loud: tool calls the parser could not read, and replies cut at max_tokens."""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import httpx
import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig, SampleConfig
from agentlightning_lite.serving import PolicyServer
from agentlightning_lite.serving.engines import ScriptedEngine

pytest.importorskip("torch")

from agentlightning_lite.rl.batching import trained
from agentlightning_lite.rl.grpo import GRPO
from agentlightning_lite.rl.rollouts import RolloutResult, RolloutSpec
from agentlightning_lite.rl.samples import build_samples

BROKEN = "<tool_call>{not json</tool_call>"
TOOLS = [{"type": "function", "function": {"name": "calc", "parameters": {"type": "object"}}}]
CHAT_LOGGER = "agentlightning_lite.serving.routes.chat"


def _rollouts(
    store: agl.Store, server: PolicyServer, bodies: list[list[dict[str, Any]]], rewards: list[float]
) -> list[RolloutResult]:
    """One training rollout per list of request bodies, each body posted in turn, then finished."""
    out = []
    for k, (calls, reward) in enumerate(zip(bodies, rewards, strict=True)):
        spec = RolloutSpec({"q": k}, "train", {"step": 3, "task_index": 0})
        ro = store.start_rollout(spec.task, mode="train", metadata=spec.metadata)
        llm = server.llm(ro.rollout_id)
        with httpx.Client(base_url=llm.base_url, timeout=30) as http:
            for body in calls:
                r = http.post("/chat/completions", json={"model": llm.model, **body})
                assert r.status_code == 200, r.text
        store.finish_rollout(ro.rollout_id, reward=reward)
        out.append(RolloutResult(ro.rollout_id, spec, "succeeded", reward, None, 0.1))
    return out


def test_an_unparsed_tool_call_is_recorded_counted_and_warned_once(caplog: pytest.LogCaptureFixture) -> None:
    store = agl.MemoryStore()
    good = {"tool_calls": [{"name": "calc", "arguments": {"x": 1}}]}
    engine = ScriptedEngine([BROKEN, good, BROKEN], tokenizer="bytes")
    ask = {"messages": [{"role": "user", "content": "2+2?"}], "tools": TOOLS}
    with PolicyServer(engine, store) as server, caplog.at_level(logging.WARNING, logger=CHAT_LOGGER):
        results = _rollouts(store, server, [[ask, ask, ask]], [1.0])
    spans = [s for s in store.spans(results[0].rollout_id) if s.kind == "llm"]
    broken = [s for s in spans if s.attributes.get("tool_parse_failed")]
    assert len(broken) == 2 and len(spans) == 3
    assert all(s.attributes["tool_parser"] == "hermes" for s in broken)
    assert [s.output["content"] for s in broken] == [BROKEN, BROKEN]  # hermes: the block stays content
    assert [s.attributes["reply_text"] for s in broken] == [BROKEN, BROKEN]  # every format: kept whole
    assert "tool_calls" not in broken[0].output
    [warning] = [r for r in caplog.records if r.name == CHAT_LOGGER]  # once per server, not per reply
    assert "'hermes' tool parser" in warning.getMessage() and "{not json" in warning.getMessage()
    _, stats = build_samples(results, store, version=0)  # what the step's metrics take in
    assert stats["tools/unparsed"] == 2.0 and stats["tools/parsed"] == 1.0


@pytest.mark.parametrize("name", ["hermes", "qwen3_coder", "glm45", "mistral", "llama3_json", "kimi_k2"])
def test_every_tool_parser_flags_a_marker_it_cannot_read(name: str) -> None:
    from agentlightning_lite.serving import parsers

    marker = parsers.TOOL_PARSERS[name].markers[0]
    text = f"Let me call it.{marker}garbage"
    reply = parsers.reply_parser(name).parse(text, TOOLS)
    assert reply.tool_parse_failed and reply.calls == []
    assert not parsers.reply_parser(name).parse("No call here.", TOOLS).tool_parse_failed


def _cut_and_whole(truncated: str) -> tuple[list[Any], dict[str, float], list[agl.Transition]]:
    """Two rollouts of one task: one reply cut at max_tokens (reward 1), one whole (reward 0)."""
    store = agl.MemoryStore()
    engine = ScriptedEngine(["a long reply that does not fit", "ok"], tokenizer="bytes")
    short = {"messages": [{"role": "user", "content": "Talk."}], "max_tokens": 4}
    with PolicyServer(engine, store) as server:
        results = _rollouts(store, server, [[short], [short]], [1.0, 0.0])
    ts = agl.transitions(store)
    samples, stats = build_samples(results, store, version=0, truncated=truncated, truncated_reward=-0.5)
    return samples, stats, ts


def test_a_reply_cut_at_max_tokens_keeps_its_reason_on_span_and_transition() -> None:
    samples, stats, ts = _cut_and_whole("keep")
    assert sorted(t.finish_reason or "" for t in ts) == ["length", "stop"]
    assert stats["samples/truncated"] == 1.0
    cut = next(s for s in samples if s.meta.get("truncated"))
    assert cut.reward == 1.0 and not cut.meta.get("masked") and len(trained(samples)) == 2


def test_truncated_mask_keeps_the_baseline_and_drops_the_loss() -> None:
    samples, stats, _ = _cut_and_whole("mask")
    assert stats["samples/truncated"] == 1.0
    GRPO(group_size=2).advantages(samples)  # the cut reply's reward still counts in its group
    cut = next(s for s in samples if s.meta.get("truncated"))
    whole = next(s for s in samples if not s.meta.get("truncated"))
    assert cut.meta["masked"] and cut.reward == 1.0 and whole.advantage < 0
    assert trained(samples) == [whole]


def test_truncated_penalty_gives_the_fixed_reward() -> None:
    samples, stats, _ = _cut_and_whole("penalty")
    assert stats["samples/truncated"] == 1.0
    assert sorted(s.reward for s in samples) == [-0.5, 0.0]
    assert len(trained(samples)) == 2


def test_truncated_setting_is_checked() -> None:
    assert SampleConfig().truncated == "keep"
    with pytest.raises(ValueError, match="truncated must be 'keep', 'mask' or 'penalty'"):
        SampleConfig(truncated="drop")


@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_an_over_long_prompt_fails_its_rollout_and_the_step_trains_the_others(
    tiny_engine: Any, tmp_path: Path
) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    engine.max_context = 256  # the long task's prompt (about 1000 byte tokens) does not fit

    def agent(task: dict, llm: agl.LLM) -> float:
        llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, max_tokens=4, messages=[{"role": "user", "content": task["q"]}]
        )
        return random.random()  # a spread in every group, so the step updates

    trainer = agl.Trainer(
        engine=engine,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        logging_config=LoggingConfig(loggers=[]),
    )
    metrics = trainer.fit(agent, [{"q": "Hi."}, {"q": "x" * 1000}], steps=1)
    assert trainer.step == 1
    assert metrics["train/failed_rollouts"] == 2.0 and metrics["train/rollouts"] == 4.0
    assert metrics["train/samples"] == 2.0 and not metrics.get("train/skipped_update")
    failed = [r for r in trainer.store.rollouts(mode="train") if r.status == "failed"]
    assert len(failed) == 2 and all(r.task == {"q": "x" * 1000} for r in failed)
    assert all("maximum context length is 256 tokens" in (r.error or "") for r in failed)
