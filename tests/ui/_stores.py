"""Stores for the web view's tests: a small realistic one, and a 100,000-rollout one made fast."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.serving.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def _llm(rid: str, sid: str, t: float, agent: str, prompt: str, reply: str, **kw: Any) -> agl.Span:
    ids = TOK.encode(reply + "<|im_end|>")
    return agl.Span(
        span_id=sid,
        rollout_id=rid,
        parent_id=kw.pop("parent_id", None),
        kind="llm",
        name="chat.completions",
        agent=agent,
        start_time=t,
        end_time=t + 0.0025,
        input=[{"role": "user", "content": prompt}],
        output={
            "role": "assistant",
            "content": reply,
            **({"tool_calls": kw["tool_calls"]} if "tool_calls" in kw else {}),
        },
        model="tiny",
        prompt_token_ids=TOK.encode(prompt),
        response_token_ids=ids,
        response_logprobs=[-0.5] * len(ids),
        attributes={
            "adapter": kw.get("adapter"),
            "weights_version": 3,
            "finish_reason": "stop",
            "prompt_text": f"<|im_start|>user\n{prompt}<|im_end|>",
        },
    )


def small_store(path: Path) -> dict[str, Any]:
    """Two GRPO groups of a training step (rewards 1.0 / 0.0), one val rollout, one failed trace
    rollout. Returns the ids the tests look for."""
    store = agl.SQLiteStore(path)
    ids: dict[str, Any] = {"train": []}
    for task_index in range(2):
        for sample in range(2):
            reward = 1.0 if sample == 0 else 0.0
            ro = store.start_rollout(
                {"question": f"what is {task_index}+2?"},
                mode="train",
                metadata={"step": 0, "task_index": task_index, "sample": sample},
            )
            rid = ro.rollout_id
            t = ro.start_time + 0.001
            answer = str(task_index + 2) if reward else "7"
            spans = [
                agl.Span(
                    span_id=f"{rid}-agent",
                    rollout_id=rid,
                    kind="agent",
                    name="solver-run",
                    agent="solver",
                    start_time=t,
                    end_time=t + 0.020,
                ),
                _llm(
                    rid,
                    f"{rid}-c1",
                    t + 0.001,
                    "solver",
                    f"what is {task_index}+2?",
                    "calc",
                    parent_id=f"{rid}-agent",
                    adapter="solver",
                    tool_calls=[
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "calculator", "arguments": '{"expr": "x"}'},
                        }
                    ],
                ),
                agl.Span(
                    span_id=f"{rid}-tool",
                    rollout_id=rid,
                    parent_id=f"{rid}-agent",
                    kind="tool",
                    name="calculator",
                    agent="solver",
                    start_time=t + 0.005,
                    end_time=t + 0.006,
                    input={"expr": "x"},
                    status="error" if sample else "ok",
                    error="ZeroDivisionError: division by zero" if sample else None,
                    output=None if sample else task_index + 2,
                ),
                _llm(
                    rid,
                    f"{rid}-c2",
                    t + 0.007,
                    "solver",
                    "tool said",
                    f"answer {answer}",
                    parent_id=f"{rid}-agent",
                    adapter="solver",
                ),
                agl.Span(
                    span_id=f"{rid}-judge",
                    rollout_id=rid,
                    kind="llm",
                    name="judge",
                    agent="judge",
                    start_time=t + 0.010,
                    end_time=t + 0.011,
                    model="gpt-judge",
                    input="judge this",
                    output="looks right",
                    attributes={"agl.source": "openai"},
                ),
                agl.Span(
                    span_id=f"{rid}-reward",
                    rollout_id=rid,
                    kind="reward",
                    name="exact_match",
                    start_time=t + 0.019,
                    end_time=t + 0.019,
                    output=reward,
                    attributes={"final": True},
                ),
            ]
            store.add_spans(spans)
            time.sleep(max(0.0, t + 0.021 - time.time()))  # the rollout ends after its spans
            store.finish_rollout(rid, reward=reward)
            ids["train"].append(rid)
    ro = store.start_rollout("val task", mode="val")
    store.add_spans(
        [_llm(ro.rollout_id, f"{ro.rollout_id}-c1", ro.start_time, "solver", "val?", "val answer")]
    )
    time.sleep(0.003)
    store.finish_rollout(ro.rollout_id, reward=0.5)
    ids["val"] = ro.rollout_id
    ro = store.start_rollout("broken task", mode="trace")
    store.finish_rollout(ro.rollout_id, status="failed", error="RuntimeError: the agent crashed")
    ids["failed"] = ro.rollout_id
    store.close()
    return ids


def write_metrics(run_dir: Path, steps: int = 5) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "metrics.jsonl"
    with open(path, "w") as f:
        for s in range(steps):
            row: dict[str, Any] = {
                "step": s,
                "train/reward_mean": 0.1 * s,
                "train/loss": 1.0 - 0.1 * s,
                "train/kl": 0.01 * s,
            }
            if s % 2 == 1:
                row.update({"val/reward_mean": 0.2 * s, "val/success_rate": 0.1 * s})
            f.write(json.dumps(row) + "\n")
    return path


def big_store(path: Path, n: int = 100_000) -> None:
    """``n`` finished rollouts with two spans each, written with executemany (a few seconds)."""
    agl.SQLiteStore(path).close()  # the schema and the file's marks
    conn = sqlite3.connect(path)
    t0 = 1_700_000_000.0
    modes = ("train", "val", "trace")
    statuses = ("succeeded", "succeeded", "succeeded", "failed")
    rollouts = [
        (
            f"ro-{i:06d}",
            json.dumps({"q": i}),
            modes[i % 3],
            statuses[i % 4],
            t0 + i,
            t0 + i + (i % 7) * 0.1,
            (i % 11) / 10.0,
            json.dumps({"step": i // 64, "task_index": i % 8}),
            None,
        )
        for i in range(n)
    ]
    spans = []
    for i in range(n):
        rid = f"ro-{i:06d}"
        spans.append(
            (
                f"{rid}-a",
                rid,
                None,
                "llm",
                "chat",
                f"agent{i % 5}",
                t0 + i,
                t0 + i + 0.1,
                "ok",
                None,
                '"q"',
                '"a"',
                "{}",
                "tiny",
                None,
                None,
                None,
            )
        )
        spans.append(
            (
                f"{rid}-t",
                rid,
                None,
                "tool",
                "calc",
                f"agent{i % 5}",
                t0 + i,
                t0 + i + 0.1,
                "ok",
                None,
                '"1"',
                '"2"',
                "{}",
                None,
                None,
                None,
                None,
            )
        )
    with conn:
        conn.executemany("INSERT INTO rollouts VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rollouts)
        conn.executemany(
            "INSERT INTO spans (span_id, rollout_id, parent_id, kind, name, agent, start_time, end_time, "
            "status, error, input, output, attributes, model, prompt_token_ids, response_token_ids, "
            "response_logprobs) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            spans,
        )
    conn.close()
