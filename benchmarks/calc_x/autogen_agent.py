"""The Calc-X agent: an AutoGen AgentChat ``AssistantAgent`` with a calculator tool, as in the paper.

One rollout::

    question ──► calc (AssistantAgent, policy model via the PolicyServer)
                   │ tool call: calculator({"expression": "12 * 7"}) ──► "84"     (at most 3 tool turns)
                   │ ...
                   └─► "### ANSWER: 84 ###" ──► reward: 1.0 if it equals the gold result, else 0.0

The agent is plain AutoGen; the only training-specific line is ``agl_autogen.instrument()``, which turns
each model call into an ``llm`` span (joined with the server's token-level span) and each calculator
call into a ``tool`` span with its success or error, so :data:`AIR` can reward the call that asked for a
well-formed calculation. The system prompt shows the ``<tool_call>`` format the PolicyServer parses for
models without native tool support (models with it may use their own, which the server parses too), and
a worked example (one calculator call, then the answer) is part of the agent's context as real chat
turns, rendered in whatever tool-call format the model's chat template uses.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.messages import TextMessage, ToolCallExecutionEvent
from autogen_core import FunctionCall
from autogen_core.model_context import UnboundedChatCompletionContext
from autogen_core.models import (
    AssistantMessage,
    FunctionExecutionResult,
    FunctionExecutionResultMessage,
    LLMMessage,
    ModelFamily,
    UserMessage,
)
from autogen_ext.models.openai import OpenAIChatCompletionClient

import agentlightning_lite as agl
from agentlightning_lite.adapters import autogen as agl_autogen

from .._harness import report
from .calculator import calculator
from .reward import has_marker, score

__all__ = [
    "AGENT_NAME",
    "AIR",
    "CREDIT",
    "EXAMPLE",
    "SYSTEM_PROMPT",
    "Settings",
    "agent",
    "make_agent",
    "solve",
]

AGENT_NAME = "calc"
SYSTEM_PROMPT = (
    "You are a math assistant with a calculator. For each arithmetic step, call it like this:\n"
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>\n'
    "and you get the result back. When you know the result, reply with the final answer in the form "
    "### ANSWER: <number> ###"
)
#: the worked example the agent starts from (a question, one calculator call, its result, the answer)
EXAMPLE: list[LLMMessage] = [
    UserMessage(content="A box holds 12 pencils. How many pencils are in 7 boxes?", source="user"),
    AssistantMessage(
        content=[FunctionCall(id="call_example", name="calculator", arguments='{"expression": "12 * 7"}')],
        source=AGENT_NAME,
    ),
    FunctionExecutionResultMessage(
        content=[
            FunctionExecutionResult(call_id="call_example", content="84", name="calculator", is_error=False)
        ]
    ),
    AssistantMessage(content="### ANSWER: 84 ###", source=AGENT_NAME),
]
MODEL_INFO = {
    "vision": False,
    "function_calling": True,
    "json_output": False,
    "family": ModelFamily.UNKNOWN,
    "structured_output": False,
}
#: AIR: a calculator call that ran earns its LLM call +0.1, a malformed one -0.1
AIR = [agl.air.ToolStatus(success=0.1, error=-0.1, tools=("calculator",))]
#: every call gets the episode's reward (the paper's default) plus its own intermediate rewards
CREDIT = agl.credit.FinalReward(add_intermediate=True)


@dataclass(frozen=True)
class Settings:
    """How the agent samples: per model call ``max_tokens``, ``temperature``; ``max_tool_turns``."""

    temperature: float = 1.0
    max_tokens: int = 96
    max_tool_turns: int = 3
    #: seconds one model call may take (a CPU engine under a full batch is slow)
    timeout_s: float = 900.0


_lock = threading.Lock()
_instrumentation: Any = None


def _instrument() -> None:
    """Install the AutoGen adapter once per process (rollouts run concurrently in threads)."""
    global _instrumentation
    with _lock:
        if _instrumentation is None or not _instrumentation.active:
            _instrumentation = agl_autogen.instrument()


async def solve(task: dict[str, Any], llm: agl.LLM, settings: Settings = Settings()) -> float:
    """Run the agent on one Calc-X task against ``llm``; returns the reward and reports tool metrics."""
    _instrument()
    client = OpenAIChatCompletionClient(
        model=llm.model,
        base_url=llm.base_url,
        api_key=llm.api_key,
        model_info=MODEL_INFO,  # type: ignore[arg-type]
        temperature=settings.temperature,
        max_tokens=settings.max_tokens,
        stop=["</tool_call>"],  # one call per turn; the server parses the unclosed block
        max_retries=0,
        timeout=settings.timeout_s,
    )
    calc = AssistantAgent(
        AGENT_NAME,
        model_client=client,
        tools=[calculator],
        system_message=llm.prompt("system", default=SYSTEM_PROMPT),  # agl.APO may rewrite it
        model_context=UnboundedChatCompletionContext(initial_messages=list(EXAMPLE)),
        reflect_on_tool_use=True,
        max_tool_iterations=settings.max_tool_turns,
    )
    try:
        result = await calc.run(task=task["question"])
    finally:
        await client.close()
    final = result.messages[-1]
    text = final.content if isinstance(final, TextMessage) else None
    outcomes = [
        r.is_error for m in result.messages if isinstance(m, ToolCallExecutionEvent) for r in m.content
    ]
    reward = score(text, task["result"], task["question"])
    report(
        tool_calls=len(outcomes),
        tool_errors=sum(outcomes),
        answer_format=float(has_marker(text)),
    )
    return reward


def make_agent(**settings: Any) -> Callable[[dict[str, Any], agl.LLM], Awaitable[float]]:
    """The agent function ``(task, llm) -> reward`` with these :class:`Settings` (``temperature=0.0``...)."""
    fixed = Settings(**settings)

    async def calc_x_agent(task: dict[str, Any], llm: agl.LLM) -> float:
        return await solve(task, llm, fixed)

    return calc_x_agent


#: the training agent with the default settings (sampling at temperature 1.0)
agent = make_agent()
