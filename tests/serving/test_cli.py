"""``agl-lite serve`` as a new user runs it: a real process, the openai client, the SQLite file."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import build_parser, main

pytest.importorskip("openai")
pytest.importorskip("transformers")


def test_parser_defaults():
    args = build_parser().parse_args(["serve"])
    assert (args.model, args.host, args.port, args.db, args.engine) == (
        "smollm2-135m",
        "127.0.0.1",
        8000,
        None,
        "hf",
    )


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
