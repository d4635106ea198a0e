"""NeMo Gym resources servers as an environment: its protocol spoken over HTTP, no nemo-gym install.

A rollout is NeMo Gym's simple agent loop: ``POST /seed_session`` with the task row, the model's
tool calls sent to ``POST /<tool name>`` with their arguments, then ``POST /verify`` with the row and
the whole Responses-shaped response; the reward is the verify reply's ``reward``. Cookies the server
sets (its session) go back on every later request of the same rollout.
"""

from __future__ import annotations

import http.cookiejar
import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .base import Environment
from .episode import (
    EpisodeResult,
    EpisodeSpec,
    Hooks,
    Observation,
    Reply,
    StepResult,
    ToolCall,
    ToolResult,
    run_episode,
)

__all__ = ["NemoGym", "chat_messages", "chat_tools"]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return "".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))


def chat_messages(params: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of ``responses_create_params``: its ``instructions`` and its ``input``.

    >>> chat_messages({"instructions": "Be brief.", "input": [
    ...     {"role": "developer", "content": "Use tools."},
    ...     {"role": "user", "content": [{"type": "input_text", "text": "Weather in Oslo?"}]}]})
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'role': 'system', 'content': 'Be brief.'}, {'role': 'system', 'content': 'Use tools.'},
     {'role': 'user', 'content': 'Weather in Oslo?'}]
    """
    out: list[dict[str, Any]] = []
    if params.get("instructions"):
        out.append({"role": "system", "content": str(params["instructions"])})
    items = params.get("input", [])
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            out.append({"role": role, "content": _text(item.get("content", ""))})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function"}
            call["function"] = {"name": item["name"], "arguments": item.get("arguments", "{}")}
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
    return out


def chat_tools(tools: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Responses API function tools as Chat Completions tools (other kinds of tool are left out).

    >>> chat_tools([{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}])
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'type': 'function',
      'function': {'name': 'get_weather', 'description': '', 'parameters': {'type': 'object'}}}]
    """
    out = []
    for tool in tools:
        if tool.get("type", "function") == "function":
            spec = {"name": tool["name"], "description": tool.get("description") or ""}
            out.append({"type": "function", "function": {**spec, "parameters": tool.get("parameters") or {}}})
    return out


class _Session:
    """One rollout's HTTP conversation with the resources server (its cookies kept)."""

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url, self.timeout = base_url.rstrip("/"), timeout
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
        )

    def post(self, route: str, body: Any) -> tuple[int, str]:
        request = urllib.request.Request(
            f"{self.base_url}/{route.lstrip('/')}",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with self.opener.open(request, timeout=self.timeout) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:  # a tool may answer an error: the model sees it
            return exc.code, exc.read().decode()

    def post_ok(self, route: str, body: Any) -> dict[str, Any]:
        status, text = self.post(route, body)
        if status >= 400:
            raise RuntimeError(f"NeMo Gym {self.base_url}/{route} answered {status}: {text[:500]}")
        data: dict[str, Any] = json.loads(text) if text.strip() else {}
        return data


class NemoGym(Environment):
    """A NeMo Gym resources server at ``base_url``, with tasks from its dataset rows.

    ``data`` is a JSONL path or a list of rows, as NeMo Gym's datasets: each row has
    ``responses_create_params`` (``input``, ``tools``, maybe ``instructions``) and whatever else
    the server's ``/verify`` reads. The default agent offers the row's tools to the model, runs
    each tool call on the server (a ``tool`` span, so ``agl.air.ToolStatus`` sees its outcome),
    until the model answers without tools or ``max_steps`` model calls, and returns ``/verify``'s
    reward. Needs no extra: the protocol is plain HTTP.

    >>> import agentlightning_lite as agl
    >>> rows = [{"responses_create_params": {"input": "Weather in Oslo?", "tools": []}}]
    >>> env = agl.envs.NemoGym("http://127.0.0.1:8000", data=rows)
    >>> env.tasks == rows
    True
    >>> # trainer.fit(env.agent, env.tasks)  (with the resources server running)
    """

    def __init__(
        self,
        base_url: str,
        data: str | Path | Iterable[dict[str, Any]] = (),
        *,
        max_steps: int = 8,
        max_tokens: int = 1024,
        timeout: float = 300.0,
        temperature: float = 1.0,
        eval_temperature: float = 0.0,
    ) -> None:
        self.base_url, self.max_steps, self.max_tokens, self.timeout = (
            base_url,
            max_steps,
            max_tokens,
            timeout,
        )
        if isinstance(data, (str, Path)):
            lines = Path(data).read_text(encoding="utf-8").splitlines()
            rows = [json.loads(line) for line in lines if line.strip()]
        else:
            rows = list(data)
        bad = [i for i, r in enumerate(rows) if "responses_create_params" not in r]
        if bad:
            raise ValueError(f"NeMo Gym rows need responses_create_params; rows {bad[:5]} have none")
        super().__init__(rows, temperature=temperature, eval_temperature=eval_temperature)

    def play(self, task: dict[str, Any], llm: Any, temperature: float) -> float:
        """Seed a session, let the model call the server's tools, verify; the verify reward."""
        session = _Session(self.base_url, self.timeout)
        session.post_ok("/seed_session", task)
        params = task["responses_create_params"]
        spec = EpisodeSpec(
            "nemo_gym",
            max_turns=self.max_steps,
            max_tokens=params.get("max_output_tokens") or self.max_tokens,
            timeout=self.timeout,
        )
        return run_episode(_Episode(self, session, task, llm.model), spec, llm, temperature)

    def __repr__(self) -> str:
        return f"NemoGym({self.base_url!r}, {len(self.tasks)} tasks)"


def _message_item(text: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": content,
    }


def _call_item(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    item = {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    return {**item, "id": f"fc_{uuid.uuid4().hex}", "status": "completed"}


class _Episode(Hooks):
    """One NeMo Gym episode's hooks: the row's messages and tools, tool calls posted to the server,
    the model's turns gathered as Responses output items for ``/verify``."""

    def __init__(self, env: NemoGym, session: _Session, task: dict[str, Any], model: str) -> None:
        self.env, self.session, self.task, self.model = env, session, task, model
        self.params: dict[str, Any] = task["responses_create_params"]
        self.output: list[dict[str, Any]] = []

    def reset(self) -> StepResult:
        tools = chat_tools(self.params.get("tools", []))
        return StepResult(Observation(chat_messages(self.params), tools=tools))

    def replied(self, reply: Reply) -> None:
        if reply.text:
            self.output.append(_message_item(reply.text))

    def act(self, reply: Reply) -> StepResult:
        return StepResult(done=True)  # an answer without tools ends the episode: verify it

    def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        status, result = self.session.post(f"/{name}", arguments)
        return ToolResult(result, error=f"{name} answered {status}" if status >= 400 else None)

    def answered(self, call: ToolCall, result: ToolResult) -> None:
        self.output.append(_call_item(call.id, call.name, call.arguments))
        self.output.append({"type": "function_call_output", "call_id": call.id, "output": result.text})

    def reward(self, episode: EpisodeResult) -> float:
        params = self.params
        response = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": self.model,
            "output": self.output,
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "tool_choice": params.get("tool_choice", "auto"),
            "tools": params.get("tools", []),
        }
        verified = self.session.post_ok("/verify", {**self.task, "response": response})
        if "reward" not in verified:
            raise RuntimeError(
                f"NeMo Gym {self.env.base_url}/verify answered no reward: {str(verified)[:300]}"
            )
        return float(verified["reward"])
