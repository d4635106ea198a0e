"""Concurrent first calls of the OpenAI SDK never fail: its response types are built once, under a lock,
before the rollouts' threads parse their first replies (``agentlightning_lite._compat.build_sdk_types``).

Without it, pydantic's lazy ``model_rebuild`` of those types races between threads and a reply now and
then fails to parse with ``PydanticUserError: Pydantic models should inherit from BaseModel, BaseModel
cannot be instantiated directly``. Each run is a fresh interpreter (the types are built once per
process), with 32 rollouts whose agents call a real HTTP server on 127.0.0.1 that answers them all at
once, and thread switches as frequent as the interpreter allows: the race's window wide open.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agentlightning_lite._compat import build_sdk_types

SRC = str(Path(__file__).resolve().parents[2] / "src")
ROLLOUTS = 32
#: fresh interpreters per way of making the client (unfixed, the race hit about 1 run in 4)
RUNS = int(os.environ.get("AGL_SDK_RACE_RUNS", 4))

REPLY = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": i,
                "finish_reason": "stop",
                "logprobs": None,
                "message": {"role": "assistant", "content": "4"},
            }
            for i in range(2)
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 1,
            "total_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 0},
            "completion_tokens_details": {"reasoning_tokens": 0},
        },
    }
).encode()

CHILD = """
import json, sys
{import_openai}
import agentlightning_lite as agl
from agentlightning_lite.rl.rollouts import RolloutSpec, run_rollouts

sys.setswitchinterval(1e-6)
url, n, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def agent(task, llm):
    if how == "own":  # the agent builds its own client, from the module's `import openai`
        client = openai.OpenAI(base_url=llm.base_url, api_key="k", max_retries=0)
    else:
        client = llm.openai_client(max_retries=0)
    messages = [{{"role": "user", "content": "2+2?"}}]
    reply = client.chat.completions.create(model=llm.model, n=2, messages=messages)
    return float(reply.choices[1].message.content == "4")

llm = lambda rid: agl.LLM(base_url=url, model="m", rollout_id=rid)
results = run_rollouts(agent, [RolloutSpec(i, "train") for i in range(n)], agl.Tracer(agl.MemoryStore()), llm,
                       concurrency=n, timeout=120)
print(json.dumps([[r.status, r.reward, r.error] for r in results]))
"""


@pytest.fixture
def server() -> Iterator[str]:
    """Answers chat completions, ``ROLLOUTS`` at a time: each reply waits until all have asked."""
    gate = threading.Barrier(ROLLOUTS)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", 0)))
            try:
                gate.wait(5)
            except threading.BrokenBarrierError:
                gate.reset()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(REPLY)))
            self.end_headers()
            self.wfile.write(REPLY)

        def log_message(self, *args: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        request_queue_size = 256
        daemon_threads = True

    httpd = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def run_fresh(script: Path, url: str, how: str) -> list[list[object]]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, str(script), url, str(ROLLOUTS), how],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # more than 3 s (docs/testing.md)
@pytest.mark.parametrize("how", ["own", "llm"])
def test_concurrent_first_calls_in_fresh_interpreters_never_fail(
    server: str, tmp_path: Path, how: str
) -> None:
    # "own": the agent module imports openai (the rollout runner builds the types before its threads
    # start); "llm": nothing imports it before the threads do, through llm.openai_client()
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(import_openai="import openai" if how == "own" else "")))
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: run_fresh(script, server, how), range(RUNS)))
    failed = [error for results in runs for status, _, error in results if status != "succeeded"]
    assert failed == []
    assert [reward for results in runs for _, reward, _ in results] == [1.0] * (RUNS * ROLLOUTS)


def test_the_response_types_and_all_they_reach_are_built() -> None:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessage

    assert build_sdk_types("openai") == ["openai"]
    for cls in (openai.BaseModel, ChatCompletion, ChatCompletionMessage):
        assert cls.__pydantic_complete__ and isinstance(cls.__dict__["__pydantic_core_schema__"], dict)
    assert build_sdk_types("openai", imported_only=True) == ["openai"]  # already built: nothing to do
