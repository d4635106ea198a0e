"""agl.rewards.Judge's calls through the openai client: real servers on 127.0.0.1 that stall, fail
once, or answer, and an injected client; plus the score parser's reading of negative scores."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from agentlightning_lite.rewards import Judge, JudgeParseError, parse_group, parse_score

openai = pytest.importorskip("openai")
RUBRIC = "The reply gives the correct sum as a number."


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port on 127.0.0.1 that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock.getsockname()[1]
    sock.close()


def test_a_judge_that_never_answers_names_itself_its_url_and_the_timeout(silent_port: int) -> None:
    url = f"http://127.0.0.1:{silent_port}/v1"
    judge = Judge(RUBRIC, base_url=url, model="grader-7b", timeout=0.1)  # the client's 2 retries
    with pytest.raises(TimeoutError) as err:
        judge("2+2?", "4")
    message = str(err.value)
    assert "'grader-7b'" in message and url in message and "within 0.1 s (3 tries)" in message
    assert "Judge(..., timeout=)" in message  # what to change
    assert judge.usage.calls == 0  # no answer, no call counted as made
    once = Judge(RUBRIC, base_url=url, model="grader-7b", timeout=0.3, max_retries=0)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"within 0\.3 s \(1 try\)"):
        once("2+2?", "4")
    assert time.monotonic() - t0 < 3


class _ScriptedJudge(BaseHTTPRequestHandler):
    """An OpenAI-compatible judge answering each request with the next of ``script``: a reply's
    text, or an HTTP error status; then ``Score: 9/10``."""

    requests: ClassVar[list[dict[str, Any]]] = []
    script: ClassVar[list[str | int]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        answer = type(self).script.pop(0) if type(self).script else "Right.\nScore: 9/10"
        if isinstance(answer, int):
            self._send(answer, {"error": {"message": "warming up", "type": "overloaded"}})
            return
        message = {"role": "assistant", "content": answer}
        usage = {"prompt_tokens": 40, "completion_tokens": 5, "total_tokens": 45}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                         "choices": [choice], "usage": usage})  # fmt: skip

    def _send(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def judge_url() -> Iterator[str]:
    _ScriptedJudge.requests, _ScriptedJudge.script = [], []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedJudge)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_the_openai_clients_retries_key_and_usage(judge_url: str) -> None:
    _ScriptedJudge.script = [503]
    judge = Judge(RUBRIC, base_url=judge_url, model="grader", api_key="sk-judge", max_retries=1)
    assert judge("What is 2+2?", "4") == 0.9  # the 503 was retried
    assert [r["path"] for r in _ScriptedJudge.requests] == ["/v1/chat/completions"] * 2
    assert {r["auth"] for r in _ScriptedJudge.requests} == {"Bearer sk-judge"}
    assert _ScriptedJudge.requests[1]["model"] == "grader" and _ScriptedJudge.requests[1]["max_tokens"] == 512
    assert (judge.usage.calls, judge.usage.prompt_tokens, judge.usage.completion_tokens) == (1, 40, 5)
    _ScriptedJudge.requests, _ScriptedJudge.script = [], [503]
    strict = Judge(RUBRIC, base_url=judge_url, model="grader", max_retries=0)
    with pytest.raises(RuntimeError, match=r"answered 503: .*warming up"):
        strict("What is 2+2?", "4")
    assert strict.usage.calls == 0


def test_an_injected_openai_client(judge_url: str) -> None:
    _ScriptedJudge.script = [503]
    client = openai.OpenAI(base_url=judge_url, api_key="sk-own", max_retries=1, timeout=5.0)
    judge = Judge(RUBRIC, client=client, model="grader")
    assert judge("What is 2+2?", "4") == 0.9 and judge.usage.calls == 1
    assert _ScriptedJudge.requests[-1]["auth"] == "Bearer sk-own"
    assert judge_url in repr(judge)
    with pytest.raises(ValueError, match="needs model"):
        Judge(RUBRIC, client=client)
    with pytest.raises(ValueError, match="not base_url and client"):
        Judge(RUBRIC, base_url=judge_url, model="m", client=client)
    with pytest.raises(TypeError, match=r"openai\.OpenAI client, got str"):
        Judge(RUBRIC, client="http://127.0.0.1:1/v1", model="m")
    with pytest.raises(ValueError, match=r"its own endpoint \(client\)"):
        judge("2+2?", "4", llm=object())
    with pytest.raises(ValueError, match="timeout must be positive"):
        Judge(RUBRIC, timeout=0)


def test_a_negative_score_is_no_score(judge_url: str) -> None:
    assert parse_score("Score: -1/10") is None  # not 0.1: the minus sign belongs to the number
    assert parse_score("**Score**: -3") is None and parse_score("score = -0.5 out of 1") is None
    assert parse_score("Score: \u22121/10") is None  # a typographic minus is not read as 1/10 either
    assert parse_score("Score: 0/10") == 0.0 and parse_score("**Score:** 7/10") == 0.7
    assert parse_group("Reply 1: Score: -1/10\nReply 2: Score: 4/10", 2) == [None, 0.4]
    _ScriptedJudge.script = ["Bad.\nScore: -1/10"]
    judge = Judge(RUBRIC, base_url=judge_url, model="grader")
    with pytest.raises(JudgeParseError, match="unparsed = 1"):
        judge("2+2?", "5")
    assert judge.usage.unparsed == 1 and judge.usage.calls == 1
