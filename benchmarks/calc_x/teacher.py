"""The Calc-X teacher: a scripted engine that replies with a task's gold chain, for the SFT warm start.

The real AutoGen agent runs against it through the PolicyServer, so the recorded calls have exactly the
prompts, tool-call format and token ids the agent produces with the policy: one calculator call per
``<gadget id="calculator">`` step of the reference ``chain``, then ``### ANSWER: <last result> ###``.

>>> task = {"question": "How many degrees of 75 make a right angle?", "result": "15",
...         "chain": '<gadget id="calculator">90 - 75</gadget>\\n<output>15</output>\\n<result>15</result>'}
>>> reply = teacher_reply({task["question"]: task})
>>> reply([{"role": "user", "content": task["question"]}])
{'tool_calls': [{'name': 'calculator', 'arguments': {'expression': '90 - 75'}}]}
>>> reply([{"role": "user", "content": task["question"]}, {"role": "assistant", "content": None},
...        {"role": "tool", "content": "15"}])
'### ANSWER: 15 ###'
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from .calculator import calculator

__all__ = ["chain_steps", "make_teacher", "teacher_reply"]

_GADGET = re.compile(r'<gadget id="calculator">(.*?)</gadget>', re.S)


def chain_steps(chain: str) -> list[str]:
    """The calculator expressions of a Calc-X ``chain``, in order.

    >>> chain_steps('<gadget id="calculator">1 / 4</gadget><output>0.25</output>'
    ...             '<gadget id="calculator">90 / (1/4)</gadget>')
    ['1 / 4', '90 / (1/4)']
    """
    return [m.strip() for m in _GADGET.findall(chain)]


def _answer(task: dict[str, Any]) -> str:
    steps = chain_steps(task.get("chain", ""))
    try:  # the number the agent saw last: what a student of the chain would copy
        value = calculator(steps[-1]) if steps else str(task["result"])
    except (ValueError, ZeroDivisionError, OverflowError):
        value = str(task["result"])
    return f"### ANSWER: {value} ###"


def teacher_reply(by_question: dict[str, dict[str, Any]]) -> Callable[[list[dict[str, Any]]], Any]:
    """``messages -> reply``: the next step of the gold chain of the task asked in the last user turn."""

    def reply(messages: list[dict[str, Any]]) -> Any:
        last_user = max(i for i, m in enumerate(messages) if m.get("role") == "user")
        question = messages[last_user].get("content")
        task = by_question.get(question if isinstance(question, str) else "")
        if task is None:
            return "### ANSWER: 0 ###"
        done = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "assistant")
        steps = chain_steps(task.get("chain", ""))
        if done < len(steps):
            return {"tool_calls": [{"name": "calculator", "arguments": {"expression": steps[done]}}]}
        return _answer(task)

    return reply


def make_teacher(tasks: Sequence[dict[str, Any]], model: str = "smollm2-135m") -> Any:
    """An ``agl.engines.ScriptedEngine`` (the policy's tokenizer) that solves ``tasks`` by their chains."""
    from agentlightning_lite.serving.engines import ScriptedEngine

    return ScriptedEngine(teacher_reply({t["question"]: t for t in tasks}), tokenizer=model)
