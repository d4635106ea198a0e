"""The example agent and the Calc-X AutoGen agent read their system prompt through ``llm.prompt``: without
prompts the model sees exactly the text they declared before (RL unchanged); a rollout's
``metadata["prompts"]`` replaces it; the read is recorded as an ``agl.prompt`` span."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.prompts import PROMPT_SPAN
from agentlightning_lite.serving import PolicyServer, engines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

from calc_agent import SYSTEM, calc_agent  # noqa: E402

#: the system prompts as they were module constants, before the agents read them through llm.prompt
CALC_SYSTEM = "You are a math assistant. To compute, write <calc>expression</calc>; you get the result back."
CALC_X_SYSTEM = (
    "You are a math assistant with a calculator. For each arithmetic step, call it like this:\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>\n'
    "and you get the result back. When you know the result, reply with the final answer in the form "
    "### ANSWER: <number> ###"
)


def run(agent: Any, task: dict[str, Any], reply: str, prompts: dict[str, str] | None) -> tuple[list, list]:
    """One rollout against a scripted policy; the system messages it was sent and the prompt spans."""
    seen: list[list[dict[str, Any]]] = []

    def answer(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return reply

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    meta = {"prompts": prompts} if prompts else {}
    with PolicyServer(engines.ScriptedEngine(answer, tokenizer="bytes"), store) as server:
        with tracer.rollout(task, metadata=meta) as ro:
            out = agent(task, server.llm(ro.id))
            if asyncio.iscoroutine(out):
                asyncio.run(out)
    systems = [m[0]["content"] for m in seen if m and m[0]["role"] == "system"]
    reads = [
        (s.attributes["component"], s.attributes["source"], s.output)
        for s in store.spans(ro.id)
        if s.name == PROMPT_SPAN
    ]
    return systems, reads


def test_the_example_agent_sees_its_default_system_prompt_unless_given_one() -> None:
    task = {"question": "What is 23 + 58?", "answer": 81}
    assert SYSTEM == CALC_SYSTEM
    systems, reads = run(calc_agent, task, "81", None)
    assert systems == [CALC_SYSTEM] and reads == [("system", "default", CALC_SYSTEM)]
    systems, reads = run(calc_agent, task, "81", {"system": "Answer in digits."})
    assert systems == ["Answer in digits."] and reads == [("system", "given", "Answer in digits.")]


def test_the_calc_x_autogen_agent_sees_its_default_system_prompt_unless_given_one() -> None:
    pytest.importorskip("autogen_agentchat")
    from benchmarks.calc_x.autogen_agent import SYSTEM_PROMPT, make_agent

    agent = make_agent(temperature=0.0)
    task = {"id": "t1", "question": "How much is 504 divided by 4?", "result": "126"}
    assert SYSTEM_PROMPT == CALC_X_SYSTEM
    systems, reads = run(agent, task, "### ANSWER: 126 ###", None)
    assert systems == [CALC_X_SYSTEM] and reads == [("system", "default", CALC_X_SYSTEM)]
    systems, reads = run(agent, task, "### ANSWER: 126 ###", {"system": "Use the calculator."})
    assert systems == ["Use the calculator."] and reads == [("system", "given", "Use the calculator.")]
