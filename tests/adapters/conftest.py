"""Fixtures for the adapter tests: real frameworks against a real PolicyServer on 127.0.0.1."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

# keep the frameworks off the network: no telemetry, no trace export to their clouds
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_DISABLE_TRACKING", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "0")


def called_tools(messages: list[dict[str, Any]]) -> list[str]:
    """Names of the tools the assistant already asked for in a conversation."""
    return [
        tc["function"]["name"] for m in messages if isinstance(m, dict) for tc in (m.get("tool_calls") or [])
    ]


def system_text(messages: list[dict[str, Any]]) -> str:
    """The text of the conversation's system messages."""
    return " ".join(str(m.get("content")) for m in messages if m.get("role") == "system")


@pytest.fixture
def store() -> Iterator[agl.Store]:
    s = agl.MemoryStore()
    yield s
    s.close()


@pytest.fixture
def serve() -> Iterator[Callable[..., PolicyServer]]:
    """Start a PolicyServer with a ScriptedEngine (byte tokenizer: exact, instant) on 127.0.0.1."""
    servers: list[PolicyServer] = []

    def start(script: Any, store: agl.Store, **kwargs: Any) -> PolicyServer:
        server = PolicyServer(engines.ScriptedEngine(script, tokenizer="bytes"), store, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def foreign_endpoint() -> Iterator[Callable[[Callable[[str, dict[str, Any]], dict[str, Any]]], str]]:
    """An OpenAI-compatible endpoint that is not a PolicyServer, on 127.0.0.1 (stdlib HTTP server).

    ``foreign_endpoint(answer)`` starts it and returns its base URL (``.../v1``); ``answer(path, body)``
    gives the JSON reply to each POST.
    """
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[str, dict[str, Any]], dict[str, Any]]) -> str:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                try:
                    payload, status = json.dumps(answer(self.path, body)).encode(), 200
                except AssertionError as exc:  # a wrong request: answered 400 so that the test fails
                    payload, status = json.dumps({"error": {"message": str(exc)}}).encode(), 400
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: Any) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        servers.append(httpd)
        return f"http://127.0.0.1:{httpd.server_address[1]}/v1"

    yield start
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="session")
def hf_engine() -> Any:
    """The embedded smollm2-135m on CPU, loaded once for every slow test of the session."""
    return engines.HFEngine("smollm2-135m", device="cpu", seed=0)


def framework_llm_spans(store: agl.Store, rollout_id: str, source: str) -> list[agl.Span]:
    return [
        s for s in store.spans(rollout_id) if s.kind == "llm" and s.attributes.get("agl.source") == source
    ]


def assert_joined(store: agl.Store, rollout_id: str, source: str) -> list[tuple[agl.Span, agl.Span]]:
    """Every LLM span the adapter recorded is joined to the server span of its call; returns the pairs."""
    spans = {s.span_id: s for s in store.spans(rollout_id)}
    pairs = []
    fw = framework_llm_spans(store, rollout_id, source)
    assert fw, f"no {source} LLM spans recorded"
    for f in fw:
        sid = f.attributes.get("agl.duplicate_of")
        assert sid, f"{source} LLM span {f.span_id} was not joined: {f.attributes}"
        s = spans[sid]
        assert s.attributes["server"] == "agl" and s.has_tokens
        assert s.parent_id == f.span_id
        assert s.agent == f.agent and f.agent
        assert s.attributes["agl.framework_span_id"] == f.span_id
        assert f.attributes["agl.has_tokens"] is True
        pairs.append((f, s))
    # no server span left unclaimed: each call was seen by the framework adapter
    servers = [s for s in spans.values() if s.attributes.get("server") == "agl"]
    assert len(servers) == len(pairs)
    return pairs


def assert_transitions_have_server_tokens(
    store: agl.Store, rollout_id: str, **kwargs: Any
) -> list[agl.Transition]:
    """transitions() yields one transition per server span, with exactly that span's token ids."""
    spans = {s.span_id: s for s in store.spans(rollout_id)}
    ts = agl.transitions(store, rollout_ids=[rollout_id], **kwargs)
    assert ts
    for t in ts:
        s = spans[t.metadata["span_id"]]
        assert s.attributes["server"] == "agl"
        assert t.prompt_token_ids == s.prompt_token_ids and t.prompt_token_ids
        assert t.response_token_ids == s.response_token_ids and t.response_token_ids
        assert t.response_logprobs == s.response_logprobs
        assert t.agent == s.agent
    return ts
