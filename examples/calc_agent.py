"""A tool-using arithmetic agent: the policy may call a calculator, then answers with a number.

Written as any team would write it, with the plain ``openai`` client; nothing in it is specific
to training except that it returns its reward. Used by ``examples/quickstart.py`` and the tests.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from typing import Any

import agentlightning_lite as agl

SYSTEM = "You are a math assistant. Use the calculator tool for arithmetic, then reply with only the final number."
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression such as '23 + 58'.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "the expression"}},
            "required": ["expression"],
        },
    },
}
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.USub: operator.neg, ast.UAdd: operator.pos}


def calculate(expression: str) -> float:
    """Evaluate + - * / on numbers, safely (no ``eval``): anything else raises ``ValueError``."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        raise ValueError(f"not arithmetic: {ast.dump(node)[:60]}")

    if len(expression) > 200:
        raise ValueError("expression too long")
    return ev(ast.parse(expression.strip(), mode="eval").body)


def make_tasks(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` two-digit additions, reproducible from ``seed``."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        out.append({"question": f"What is {a} + {b}?", "answer": a + b})
    return out


def final_number(text: str | None) -> float | None:
    """The last number in the reply, if any."""
    nums = re.findall(r"-?\d+(?:\.\d+)?", (text or "").replace(",", ""))
    return float(nums[-1]) if nums else None


def calc_agent(task: dict[str, Any], llm: agl.LLM, max_turns: int = 2, temperature: float = 1.0) -> float:
    """Ask, run any calculator calls, ask again; reward 1.0 when the final number is right."""
    client = llm.openai_client(max_retries=0, timeout=120)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task["question"]},
    ]
    reply = None
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model=llm.model, messages=messages, tools=[CALCULATOR], max_tokens=32, temperature=temperature
        ).choices[0].message
        if not reply.tool_calls:
            break
        messages.append(reply.model_dump(exclude_none=True))
        for call in reply.tool_calls:
            tracer = agl.Tracer.current_rollout().tracer if agl.Tracer.current_rollout() else agl.Tracer()
            with tracer.span("tool", "calculator", input=call.function.arguments,
                             attributes={"tool_call_id": call.id}) as span:
                try:
                    expr = json.loads(call.function.arguments or "{}").get("expression", "")
                    result = str(calculate(str(expr)))
                except (ValueError, SyntaxError, ZeroDivisionError, AttributeError, TypeError) as exc:
                    span.set_error(exc)
                    result = f"error: {exc}"
                span.set_output(result)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    answer = final_number(reply.content if reply is not None else None)
    return 1.0 if answer is not None and abs(answer - task["answer"]) < 1e-6 else 0.0
