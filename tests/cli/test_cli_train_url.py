"""``agl-lite train --url``: training while an inference server elsewhere serves the rollouts (here a
PolicyServer speaking vLLM's HTTP subset over the same model, in this process, on real HTTP)."""

from __future__ import annotations

import argparse
import json
import textwrap
from pathlib import Path

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import main
from agentlightning_lite.cli.train import _engine_choice

from .._helpers import tiny_smol_dir

AGENT = textwrap.dedent(
    """
    def agent(task, llm):
        reply = llm.openai_client(max_retries=0).chat.completions.create(
            model=llm.model, max_tokens=4, temperature=1.0,
            messages=[{"role": "user", "content": task["q"]}],
        ).choices[0].message.content or ""
        return float(len(reply) % 3)
    """
)


def test_url_means_vllm_attached_and_options_are_json() -> None:
    ns = argparse.Namespace(engine="auto", url=None, backend_api_key="k", engine_option=["max_loras=4"])
    assert _engine_choice(ns) == ("auto", {"max_loras": 4})
    ns = argparse.Namespace(
        engine="auto", url=["http://a:1", "http://b:2"], backend_api_key="k", engine_option=[]
    )
    assert _engine_choice(ns) == ("vllm", {"url": ["http://a:1", "http://b:2"], "api_key": "k"})
    ns.engine_option = ["log_dir=/tmp/x y"]
    assert _engine_choice(ns)[1]["log_dir"] == "/tmp/x y"  # not JSON: taken as text


def test_train_url_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(AGENT)
    (tmp_path / "t.jsonl").write_text('{"q": "x"}\n')
    base = ["train", f"{tmp_path / 'a.py'}:agent", "--data", str(tmp_path / "t.jsonl")]
    assert main([*base, "--engine", "hf", "--url", "http://127.0.0.1:9"]) == 2
    assert "--url attaches to vLLM servers" in capsys.readouterr().err
    assert main([*base, "--engine-option", "no-equals"]) == 2
    assert "--engine-option takes KEY=VALUE" in capsys.readouterr().err


@pytest.mark.slow
def test_train_through_a_server_by_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("peft")
    from agentlightning_lite.serving import PolicyServer
    from agentlightning_lite.serving.engines import HFEngine

    model_dir = tiny_smol_dir(tmp_path / "tiny-smol")
    (tmp_path / "my_agent.py").write_text(AGENT)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps({"q": f"task {i}"}) + "\n" for i in range(2)))
    monkeypatch.chdir(tmp_path)
    backend = PolicyServer(
        HFEngine(str(model_dir), num_threads=1, seed=0), agl.MemoryStore(), api_key="k"
    ).start()
    try:
        code = main(
            [
                "train", "my_agent.py:agent", "--data", "train.jsonl", "--model", str(model_dir),
                "--url", backend.url, "--backend-api-key", "k", "--engine-option", "check_version=false",
                "--steps", "1", "--batch-size", "2", "--group-size", "2", "--lora-r", "4",
                "--output-dir", str(tmp_path / "run"), "--json",
            ]
        )  # fmt: skip
        assert code == 0
        # the server got the run's fresh adapter, then the trained one as a new version
        assert list(backend.lora_adapters) == ["policy-v1"]
        assert backend.lora_adapters["policy-v1"].startswith(str(tmp_path / "run"))
        calls = [
            s for r in backend.store.rollouts() for s in backend.store.spans(r.rollout_id) if s.kind == "llm"
        ]
        assert len(calls) == 4 and {s.attributes["adapter"] for s in calls} == {"policy-v0"}
        runs = agl.SQLiteStore(tmp_path / "run" / "runs.db")
        spans = [s for r in runs.rollouts() for s in runs.spans(r.rollout_id) if s.kind == "llm"]
        runs.close()
        assert len(spans) == 4 and all(s.response_token_ids and s.response_logprobs for s in spans)
    finally:
        backend.stop()
        backend.engine.close()
