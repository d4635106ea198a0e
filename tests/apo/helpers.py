"""Helpers of the prompt-optimisation tests (also imported by the process a resume test kills): a scripted
OpenAI-compatible reflection model on 127.0.0.1, a scripted policy whose answers depend on the system
prompt, and APO run over the trainer's rollout machinery (``InProcessRollouts`` / ``RemoteRunners``
behind ``Serving``)."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import agentlightning_lite as agl
from agentlightning_lite.rl.config import RolloutConfig
from agentlightning_lite.rl.sources import InProcessRollouts, RolloutSource, Serving
from agentlightning_lite.serving.engines import ScriptedEngine

DIGITS = "Answer with the number only, in digits."


class ReflectionServer:
    """``POST /v1/chat/completions`` answered by ``answer(prompt_text) -> text``; every request kept."""

    def __init__(self, answer: Callable[[str], str]) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if self.path != "/v1/chat/completions":
                    self.send_response(404)
                    self.end_headers()
                    return
                text = outer.answer(body["messages"][-1]["content"])
                data = json.dumps(
                    {
                        "id": "r",
                        "object": "chat.completion",
                        "model": body["model"],
                        "choices": [
                            {
                                "index": 0,
                                "finish_reason": "stop",
                                "message": {"role": "assistant", "content": text},
                            }
                        ],
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def llm(self) -> agl.LLM:
        return agl.LLM(
            base_url=f"http://127.0.0.1:{self.httpd.server_port}/v1", model="reflector", api_key="rk"
        )

    def prompts(self) -> list[str]:
        return [r["messages"][-1]["content"] for r in self.requests]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def current_instruction(prompt: str) -> str:
    """The instruction GEPA's reflection prompt asks to improve (its first ``` block)."""
    m = re.search(r"```\n(.*?)\n```", prompt, re.S)
    return m.group(1) if m else ""


def propose_digits(prompt: str) -> str:
    """A reflector that, shown a prompt without 'digits', proposes one that asks for digits."""
    if "digits" in current_instruction(prompt):
        return "```\n" + current_instruction(prompt) + " Be brief.\n```"
    return f"Looking at the feedback, the answers must be numbers.\n```\n{DIGITS}\n```"


def system_of(messages: list[dict[str, Any]]) -> str:
    return next((str(m["content"]) for m in messages if m["role"] == "system"), "")


def adder(messages: list[dict[str, Any]]) -> str:
    """The policy: adds the two numbers of the question, in digits only when the system prompt asks so."""
    a, b = map(int, re.findall(r"\d+", str(messages[-1]["content"]))[:2])
    return str(a + b) if "digits" in system_of(messages) else f"Well, {a} plus {b} makes a number."


def sum_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Reads its system prompt, asks the policy, rewards an exact answer."""
    system = llm.prompt("system", default="You are a helpful assistant.")
    reply = llm.openai_client(max_retries=0).chat.completions.create(
        model=llm.model,
        max_tokens=32,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": task["q"]}],
    )
    return float((reply.choices[0].message.content or "").strip() == str(task["a"]))


def sums(n: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"q": f"What is {i} + {i + 3}?", "a": 2 * i + 3} for i in range(start, start + n)]


def run_apo(
    agent: Any,
    train: list[Any],
    val: list[Any] | None,
    out: Path,
    store: agl.Store | None = None,
    policy: Callable[[list[dict[str, Any]]], str] = adder,
    source: RolloutSource | None = None,
    label: Any = None,
    **apo: Any,
) -> tuple[dict[str, Any], agl.Store, list[dict[str, Any]]]:
    """``agl.APO(**apo).optimize`` with the rollouts run by a rollout source over a scripted policy
    (in-process threads by default); returns the summary, the store and the metrics rows."""
    store = store if store is not None else agl.MemoryStore()
    config = RolloutConfig(concurrency=4, timeout=60)
    source = source if source is not None else InProcessRollouts(agl.Tracer(store), config)
    engine = ScriptedEngine(policy, tokenizer="bytes")
    rows: list[dict[str, Any]] = []
    resume = apo.pop("resume", False)
    with Serving(source, engine, store, config, {}).session():
        result = agl.APO(**apo).optimize(
            agent,
            train,
            val,
            collect=lambda specs: source.collect(label if label is not None else agent, specs),
            store=store,
            output_dir=out,
            log=rows.append,
            resume=resume,
        )
    return result, store, rows
