"""The real Codex and Claude Code CLIs complete a tool round trip through ``/v1/responses`` and
``/v1/messages``: the served tool call is run by the harness, its output comes back in the next
request, and both calls are training transitions with token ids (the CLIs and their sandbox as in
``tests/harness``; skipped without them)."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.harness import claude_code, codex
from agentlightning_lite.serving import PolicyServer, engines

from ..harness.conftest import cli, needs_isolation

pytestmark = pytest.mark.harness

CASES = {
    "codex": ("codex", "responses", "exec_command", {"cmd": "echo pineapple"}),
    "claude-code": ("claude", "messages", "Bash", {"command": "echo pineapple", "description": "say it"}),
}


def make(name: str, executable: str) -> agl.CommandAgent:
    if name == "codex":
        return codex(executable=executable, instructions="Be brief.", timeout=120)
    return claude_code(executable=executable, timeout=120)


@pytest.mark.parametrize("name", list(CASES))
def test_a_harness_runs_the_served_tool_call_and_answers(name: str) -> None:
    needs_isolation()
    binary, api, tool, args = CASES[name]
    executable = cli(binary)

    def script(messages: list[dict[str, Any]]) -> Any:
        if any(m["role"] == "tool" or "<tool_response>" in str(m["content"]) for m in messages):
            return "Done: pineapple."
        return {"tool_calls": [{"name": tool, "arguments": args}]}

    store = agl.MemoryStore()
    with PolicyServer(engines.ScriptedEngine(script), store) as server:
        with agl.Tracer(store).rollout("run it") as ro:
            make(name, executable)("Run the command, then answer.", server.llm(ro.id))
    spans = store.spans(ro.id)
    (harness,) = [s for s in spans if s.name == "harness"]
    assert harness.output["exit_code"] == 0 and "Done: pineapple." in harness.output["stdout"], harness.output
    first, second = [s for s in spans if s.kind == "llm"]
    assert first.attributes["api"] == second.attributes["api"] == api
    (call,) = first.output["tool_calls"]
    assert call["function"]["name"] == tool and json.loads(call["function"]["arguments"]) == args
    result = second.input[-1]
    assert (
        result["role"] == "tool" and result["tool_call_id"] == call["id"] and "pineapple" in result["content"]
    )
    ts = agl.transitions(store, rollout_ids=[ro.id])
    assert [t.response_token_ids for t in ts] == [first.response_token_ids, second.response_token_ids]
