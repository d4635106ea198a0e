"""A tool-using arithmetic agent: the policy may call a calculator, then answers with a number.

Written as any team would write it, with the plain ``openai`` client; nothing in it is specific
to training except that it returns its reward. Used by ``examples/quickstart.py`` and the tests.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

import agentlightning_lite as agl

SYSTEM = "You are a math assistant. To compute, write <calc>expression</calc>; you get the result back."
#: one worked example, as chat turns: how the calculator is used
EXAMPLE = [
    {"role": "user", "content": "What is 12 + 30?"},
    {"role": "assistant", "content": "<calc>12 + 30</calc>"},
    {"role": "user", "content": "Result: 42"},
    {"role": "assistant", "content": "42"},
]
CALC = re.compile(r"<calc>(.*?)(?:</calc>|$)", re.S)
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


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
    """Ask; if the reply calls the calculator, run it and ask again; reward 1.0 for the right number.

    The calculator protocol is plain text (``<calc>23 + 58</calc>``), as in many ReAct-style agents,
    which keeps prompts short. Each calculator run is a ``tool`` span, so ``agl.air.ToolStatus``
    can reward the call that asked for it. The system prompt is read with ``llm.prompt("system",
    default=SYSTEM)``: :data:`SYSTEM` unless ``agl.APO`` is scoring a candidate or the trainer was
    given prompts (``Trainer(prompts=...)``).
    """
    client = llm.openai_client(max_retries=0, timeout=600)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": llm.prompt("system", default=SYSTEM)},  # agl.APO may rewrite it
        *EXAMPLE,
        {"role": "user", "content": task["question"]},
    ]
    text = ""
    for turn in range(max_turns):
        reply = client.chat.completions.create(
            model=llm.model, messages=messages, max_tokens=24, temperature=temperature, stop=["</calc>"]
        )
        text = reply.choices[0].message.content or ""
        match = CALC.search(text)
        if match is None or turn == max_turns - 1:
            break
        current = agl.Tracer.current_rollout()
        tracer = current.tracer if current is not None else agl.Tracer()
        with tracer.span("tool", "calculator", input=match.group(1)) as span:
            try:
                value = calculate(match.group(1))
                result = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
            except (ValueError, SyntaxError, ZeroDivisionError, TypeError) as exc:
                span.set_error(exc)
                result = f"error: {exc}"
            span.set_output(result)
        messages += [
            {"role": "assistant", "content": text[: match.end(1)] + "</calc>"},
            {"role": "user", "content": f"Result: {result}"},
        ]
    answer = final_number(text)
    return 1.0 if answer is not None and abs(answer - task["answer"]) < 1e-6 else 0.0
