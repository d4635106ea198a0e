"""``agl-lite serve`` as a new user runs it: a real process, the openai client, the SQLite file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import build_parser, main

pytest.importorskip("openai")
pytest.importorskip("transformers")


def test_parser_defaults():
    args = build_parser().parse_args(["serve"])
    assert (args.model, args.host, args.port, args.db, args.engine) == (
        None,  # smollm2-135m for the hf and vllm engines; the server's own model for http
        "127.0.0.1",
        8000,
        None,
        "hf",
    )
    assert args.clamp_max_tokens == "auto"  # clamped on /v1/responses and /v1/messages only


def test_no_command_is_an_error(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        main([])
    assert "COMMAND" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_smollm2_and_find_the_call_in_sqlite(tmp_path: Path):
    db = tmp_path / "runs.db"
    cmd = [
        sys.executable,
        "-m",
        "agentlightning_lite.cli",
        "serve",
        "--model",
        "smollm2-135m",
        "--db",
        str(db),
        "--port",
        "0",
        "--api-key",
        "k1",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(
        cmd, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    try:
        base_url, seen = None, []
        deadline = time.monotonic() + 120
        while base_url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"serving model '.*' at (http://\S+/v1)", line)
            if m:
                base_url = m.group(1)
        assert base_url, "".join(seen)
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "calculator",
                    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
                },
            }
        ]
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0).models.list()
        c = openai.OpenAI(base_url=base_url, api_key="k1", max_retries=0)
        reply = c.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "user", "content": "What is 17*23? Use the calculator."}],
            tools=tools,
            max_tokens=40,
            temperature=0,
        )
        msg = reply.choices[0].message
        assert msg.tool_calls or msg.content

        store = agl.SQLiteStore(db)  # a second process reading the server's file
        (t,) = agl.transitions(store, require_tokens=True)
        assert t.prompt_token_ids and len(t.response_token_ids) == reply.usage.completion_tokens
        assert t.response["role"] == "assistant"
        store.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


# -- through other inference servers: --engine http / vllm --url ---------------------------------
@pytest.fixture
def backend() -> Any:
    """A PolicyServer (API key ``k``) over the tiny HF engine: the inference server behind the CLI's."""
    from agentlightning_lite.serving import PolicyServer

    from ..conftest import tiny_hf_engine

    server = PolicyServer(tiny_hf_engine(), agl.MemoryStore(), api_key="k").start()
    yield server
    server.stop()
    server.engine.close()


def test_serve_through_another_server_by_url(backend: Any, tmp_path: Path) -> None:
    """`agl-lite serve --engine http --url ...`: the calls go to the server at the URL, and the spans
    this server records hold exactly the token ids and logprobs that server's engine produces."""
    from agentlightning_lite.serving.engines import GenRequest

    db = tmp_path / "runs.db"
    cmd = [sys.executable, "-m", "agentlightning_lite.cli", "serve", "--engine", "http", "--url", backend.url]
    cmd += ["--tokenizer", "bytes", "--backend-api-key", "k", "--db", str(db), "--port", "0"]
    proc = subprocess.Popen(
        [*cmd, "--log-level", "warning"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        base_url, seen = None, []
        deadline = time.monotonic() + 120
        while base_url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()  # type: ignore[union-attr]
            if not line and proc.poll() is not None:
                break
            seen.append(line)
            m = re.search(r"serving model 'tiny' at (http://\S+/v1)", line)
            base_url = m.group(1) if m else None
        assert base_url, "".join(seen)
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
        reply = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0
        )
        store = agl.SQLiteStore(db)
        (t,) = agl.transitions(store, require_tokens=True)
        store.close()
        want = backend.engine.generate(
            [GenRequest(prompt_token_ids=t.prompt_token_ids, max_tokens=5, temperature=0)]
        )[0]
        assert t.response_token_ids == want.token_ids and reply.choices[0].message.content == want.text
        assert backend.engine.stats["requests"] == 2  # the CLI's call, and ours just now
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0


def test_serve_engine_url_errors(backend: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--engine", "http"]) == 2
    assert "--engine http needs --url" in capsys.readouterr().err
    assert main(["serve", "--url", backend.url]) == 2
    assert "--url is for --engine vllm or --engine http" in capsys.readouterr().err
    assert main(["serve", "--engine", "http", "--url", backend.url, "--backend-api-key", "k"]) == 2
    assert "needs --tokenizer" in capsys.readouterr().err
    # vllm --url checks the server's /version: a PolicyServer is not vLLM
    code = main(["serve", "--engine", "vllm", "--url", backend.url, "--tokenizer", "bytes"])
    assert code == 1 and "is an agentlightning-lite PolicyServer, not vLLM" in capsys.readouterr().err


def test_serve_takes_vllms_parser_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["serve"])
    assert (args.tool_call_parser, args.reasoning_parser) == ("auto", "auto")
    args = build_parser().parse_args(
        ["serve", "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3"]
    )
    assert (args.tool_call_parser, args.reasoning_parser) == ("qwen3_coder", "qwen3")
    assert main(["serve", "--tool-call-parser", "qwen4"]) == 2  # refused before the model loads
    assert "--tool-call-parser 'qwen4': one of auto, deepseek_v31" in capsys.readouterr().err
    assert main(["serve", "--reasoning-parser", "r2"]) == 2
    err = capsys.readouterr().err
    assert "--reasoning-parser 'r2': one of auto, deepseek_r1, gpt_oss, mistral, none" in err
