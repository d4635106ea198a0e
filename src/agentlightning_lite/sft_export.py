"""Export policy calls as chat-format JSONL for supervised fine-tuning (rejection sampling)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .store.base import Store
from .transitions import transitions

__all__ = ["export_sft", "to_messages"]


def to_messages(prompt: Any, response: Any) -> list[dict[str, Any]]:
    """Normalise an LLM span's input and output into an OpenAI-style message list."""
    if isinstance(prompt, dict) and isinstance(prompt.get("messages"), list):
        messages = list(prompt["messages"])
    elif isinstance(prompt, list):
        messages = list(prompt)
    elif prompt is None:
        messages = []
    else:
        messages = [{"role": "user", "content": prompt if isinstance(prompt, str) else json.dumps(prompt)}]
    if isinstance(response, dict) and isinstance(response.get("choices"), list) and response["choices"]:
        response = response["choices"][0].get("message", response["choices"][0])
    if isinstance(response, dict):
        reply = {k: v for k, v in response.items() if k in ("role", "content", "tool_calls", "name")}
        reply.setdefault("role", "assistant")
        reply.setdefault("content", None)
    else:
        reply = {"role": "assistant", "content": "" if response is None else str(response)}
    return [*messages, reply]


def export_sft(
    store: Store,
    path: str | os.PathLike[str],
    min_reward: float | None = None,
    agents: Iterable[str] | None = None,
    mode: str | None = None,
    rollout_ids: Iterable[str] | None = None,
) -> int:
    """Write one ``{"messages": [...], "reward": ...}`` line per policy call; return the count.

    Only calls of rollouts whose final reward is at least ``min_reward`` are written (rollouts
    without a reward are skipped when ``min_reward`` is set), so ``min_reward=1.0`` keeps the
    successful episodes only.

    >>> import os, tempfile, agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> for answer, reward in (("4", 1.0), ("5", 0.0)):
    ...     with tracer.rollout("2+2?") as ro:
    ...         with tracer.span("llm", "chat", input=[{"role": "user", "content": "2+2?"}]) as sp:
    ...             sp.set_output(answer)
    ...         ro.reward(reward)
    >>> path = os.path.join(tempfile.mkdtemp(), "sft.jsonl")
    >>> agl.export_sft(tracer.store, path, min_reward=1.0)
    1
    >>> import json
    >>> record = json.loads(open(path).read())
    >>> record["messages"], record["reward"]
    ([{'role': 'user', 'content': '2+2?'}, {'role': 'assistant', 'content': '4'}], 1.0)
    """
    items = transitions(store, rollout_ids=rollout_ids, agents=agents, mode=mode)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for t in items:
            if min_reward is not None and (t.final_reward is None or t.final_reward < min_reward):
                continue
            record = {
                "messages": to_messages(t.prompt, t.response),
                "reward": t.final_reward,
                "agent": t.agent,
                "rollout_id": t.rollout_id,
                "index": t.index,
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    os.replace(tmp, path)
    return n
