"""``agl-lite tinker``: its flags, its refusal to serve off 127.0.0.1 without a key, and a real start."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agentlightning_lite.cli import build_parser, main

SRC = Path(__file__).resolve().parents[2] / "src"


def test_flags() -> None:
    args = build_parser().parse_args(
        ["tinker", "--port", "0", "--model", "/models/x", "--output-dir", "out", "--api-key", "tml-k"]
    )
    assert (args.command, args.port, args.model, args.output_dir, args.api_key) == (
        "tinker", 0, "/models/x", "out", "tml-k"
    )  # fmt: skip
    assert (args.host, args.engine, args.store) == ("127.0.0.1", "hf", None)
    assert build_parser().parse_args(["tinker", "--store", "runs.db"]).store == "runs.db"
    vllm = build_parser().parse_args(
        ["tinker", "--engine", "vllm", "--vllm-url", "http://127.0.0.1:9", "--max-lora-rank", "32"]
    )
    assert (vllm.engine, vllm.vllm_url, vllm.max_lora_rank) == ("vllm", "http://127.0.0.1:9", 32)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tinker", "--engine", "sglang"])


def test_vllm_flags_need_the_vllm_engine(capsys: pytest.CaptureFixture) -> None:
    assert main(["tinker", "--port", "0", "--max-lora-rank", "16"]) == 2
    assert "--vllm-url and --max-lora-rank go with --engine vllm" in capsys.readouterr().err
    url = ["--engine", "vllm", "--vllm-url", "http://127.0.0.1:9"]
    assert main(["tinker", "--port", "0", *url]) == 2
    assert "--vllm-url needs --max-lora-rank" in capsys.readouterr().err
    assert main(["tinker", "--port", "0", *url, "--max-lora-rank", "0"]) == 2
    assert "--max-lora-rank must be at least 1" in capsys.readouterr().err


def test_engine_vllm_with_no_vllm_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from agentlightning_lite.serving.engines import vllm as vllm_module

    monkeypatch.setattr(vllm_module, "vllm_launcher", lambda *a, **k: None)  # no vLLM anywhere
    out = ["--output-dir", str(tmp_path / "out"), "--threads", "1"]
    assert main(["tinker", "--port", "0", "--engine", "vllm", "--model", "smollm2-135m", *out]) == 2
    err = capsys.readouterr().err
    assert "vllm" in err.lower() and "pip install" in err


def test_serving_off_loopback_needs_a_key(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.delenv("AGL_API_KEY", raising=False)
    assert main(["tinker", "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "serving on 0.0.0.0 (not 127.0.0.1) needs --api-key" in capsys.readouterr().err


@pytest.mark.slow
def test_the_command_serves_the_api(tiny_smol: Path, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "agentlightning_lite.cli", "tinker", "--model", str(tiny_smol)]
    cmd += ["--port", "0", "--output-dir", str(tmp_path / "out"), "--threads", "1", "--api-key", "tml-k"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stderr is not None
        url, lines = None, []
        deadline = time.monotonic() + 120
        while url is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"Tinker API at (http://\S+)/api/v1", line)
            url = found.group(1) if found else None
        assert url is not None, "".join(lines)
        r = httpx.post(f"{url}/api/v1/create_session", json={}, headers={"X-API-Key": "tml-k"})
        assert r.status_code == 200 and r.json()["session_id"].startswith("session-")
        caps = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-k"}).json()
        assert caps == {"supported_models": [{"model_name": str(tiny_smol)}]}
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    from agentlightning_lite.store.readonly import ReadOnlyStore

    store = ReadOnlyStore(tmp_path / "out" / "store.sqlite")  # the calls' record, closed cleanly
    assert store.rollouts() == []  # a session alone trains nothing
    store.close()
