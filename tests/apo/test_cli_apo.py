"""``agl-lite apo``: the agent file and task files in, the optimised prompts out (and ``train --prompts``).

The trainer is built with the tiny HF engine instead of the embedded model (patched in), so the command's
own wiring is what runs: arguments, loading, APO's run, the table or JSON, the prompts file."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.cli import build_parser, main
from agentlightning_lite.rl.config import LoggingConfig

from .helpers import DIGITS

AGENT = """
import agentlightning_lite as agl

def agent(task, llm):
    system = agl.prompt("system", default="You are a helpful assistant.")
    llm.openai_client(max_retries=0).chat.completions.create(model=llm.model, max_tokens=2,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": task["q"]}])
    return 1.0 if "digits" in system else 0.0
"""


def test_the_command_line_is_parsed() -> None:
    args = build_parser().parse_args(
        [
            "apo",
            "a.py:agent",
            "--data",
            "t.jsonl",
            "--reflection-base-url",
            "http://h/v1",
            "--reflection-model",
            "m",
            "--budget",
            "40",
            "--components",
            "writer/system",
            "rewriter/system",
        ]
    )
    assert (args.command, args.budget, args.components) == ("apo", 40, ["writer/system", "rewriter/system"])
    assert build_parser().parse_args(["train", "a.py:agent", "--prompts", "p.json"]).prompts == "p.json"


@pytest.mark.slow
def test_agl_lite_apo_writes_the_best_prompts(
    reflector: Any, tiny_engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"q": f"{i}+{i}"}) + "\n" for i in range(3)))
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"q": f"{i}+1"}) + "\n" for i in range(2)))
    real = agl.Trainer
    made: list[dict[str, Any]] = []

    def trainer(**kw: Any) -> agl.Trainer:
        made.append(kw)
        return real(**{**kw, "engine": tiny_engine(), "logging_config": LoggingConfig(loggers=[])})

    monkeypatch.setattr(agl, "Trainer", trainer)
    server = reflector()
    out = tmp_path / "out"
    code = main(
        [
            "apo",
            str(tmp_path / "agent.py") + ":agent",
            "--data",
            str(tmp_path / "tasks.jsonl"),
            "--val-data",
            str(tmp_path / "val.jsonl"),
            "--reflection-base-url",
            server.llm.base_url,
            "--reflection-model",
            "reflector",
            "--reflection-api-key",
            "rk",
            "--budget",
            "10",
            "--output-dir",
            str(out),
            "--json",
        ]
    )
    assert code == 0
    res = json.loads(capsys.readouterr().out)
    assert res["seed_val_score"] == 0.0 and res["best_val_score"] == 1.0
    assert res["prompts"] == {"system": DIGITS} == agl.load_prompts(res["prompts_file"])
    assert server.requests and server.requests[0]["auth"] == "Bearer rk"
    assert isinstance(made[0]["algorithm"], agl.APO) and made[0]["algorithm"].budget == 10
