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

from ..tracer import Tracer
from .base import Environment

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
        output = self._respond(session, params, llm, temperature)
        response = {
            "id": f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": int(time.time()),
            "model": llm.model,
            "output": output,
            "parallel_tool_calls": params.get("parallel_tool_calls", True),
            "tool_choice": params.get("tool_choice", "auto"),
            "tools": params.get("tools", []),
        }
        verified = session.post_ok("/verify", {**task, "response": response})
        if "reward" not in verified:
            raise RuntimeError(f"NeMo Gym {self.base_url}/verify answered no reward: {str(verified)[:300]}")
        return float(verified["reward"])

    def _respond(self, session: _Session, params: dict[str, Any], llm: Any, temperature: float) -> list[Any]:
        """The model's turns and the tools' outputs, as Responses output items."""
        client = llm.openai_client(max_retries=0, timeout=self.timeout)
        messages, tools = chat_messages(params), chat_tools(params.get("tools", []))
        max_tokens = params.get("max_output_tokens") or self.max_tokens
        output: list[dict[str, Any]] = []
        for _ in range(self.max_steps):
            options: dict[str, Any] = {"tools": tools} if tools else {}
            reply = client.chat.completions.create(
                model=llm.model, messages=messages, max_tokens=max_tokens, temperature=temperature, **options
            )
            message = reply.choices[0].message
            calls = list(message.tool_calls or [])
            if message.content:
                output.append(_message_item(message.content))
            if not calls:
                break
            messages.append(message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
            for call in calls:
                name, arguments = call.function.name, call.function.arguments
                output.append(_call_item(call.id, name, arguments))
                result = self._call_tool(session, name, arguments)
                output.append({"type": "function_call_output", "call_id": call.id, "output": result})
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        return output

    @staticmethod
    def _call_tool(session: _Session, name: str, arguments: str) -> str:
        current = Tracer.current_rollout()
        tracer = current.tracer if current is not None else Tracer()
        with tracer.span("tool", name, input=arguments) as span:
            try:
                args = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                span.set_error(exc)
                result = f"error: the arguments are not JSON: {exc}"
            else:
                status, result = session.post(f"/{name}", args)
                if status >= 400:
                    span.set_error(RuntimeError(f"{name} answered {status}"))
            span.set_output(result)
        return result

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
