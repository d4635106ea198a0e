"""CommandAgent with a stand-in harness script: endpoint, task, sandbox, time limit, spans, reward."""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.serving import PolicyServer, engines

from .conftest import needs_isolation

FAKE = str(Path(__file__).with_name("fake_harness.py"))


@pytest.fixture
def served() -> Iterator[tuple[PolicyServer, agl.Tracer]]:
    store = agl.MemoryStore()
    with PolicyServer(engines.ScriptedEngine(["a title", "first", "second"] * 20), store) as server:
        yield server, agl.Tracer(store)


def run(
    served: tuple[PolicyServer, agl.Tracer], agent: agl.CommandAgent, task: Any = "add 2 and 2"
) -> tuple[float | None, str, list[agl.Span]]:
    server, tracer = served
    with tracer.rollout(task) as ro:
        reward = agent(task, server.llm(ro.id))
        if reward is not None:
            ro.reward(reward)
    return reward, ro.id, server.store.spans(ro.id)


def harness_output(spans: list[agl.Span]) -> dict[str, Any]:
    (span,) = [s for s in spans if s.kind == "agent" and s.name == "harness"]
    return span.output


def test_every_call_of_a_run_lands_in_its_rollout_with_tokens_and_side_calls_are_not_trained(
    served: tuple[PolicyServer, agl.Tracer],
) -> None:
    needs_isolation()
    agent = agl.CommandAgent([sys.executable, FAKE, "calls"], timeout=60)
    reward, rid, spans = run(served, agent)
    assert reward == 1.0  # no reward function, no verifier: exit status 0
    llm = [s for s in spans if s.kind == "llm"]
    assert [s.agent for s in llm] == ["side", None, None]
    assert all(s.rollout_id == rid and s.prompt_token_ids and s.response_token_ids for s in llm)
    out = json.loads(harness_output(spans)["stdout"])
    assert out["title"] == "a title" and out["replies"] == ["first", "second"]
    store = served[0].store
    trained = agl.transitions(store, rollout_ids=[rid])
    assert [t.response["content"] for t in trained] == ["first", "second"]
    assert [t.reward for t in trained] == [1.0, 1.0]
    assert len(agl.transitions(store, rollout_ids=[rid], side_calls=True)) == 3
    assert [t.agent for t in agl.transitions(store, rollout_ids=[rid], agents=["side"])] == ["side"]


@pytest.mark.parametrize("via", ["arg", "stdin", "file"])
def test_the_task_reaches_the_program_by_argument_stdin_or_file(
    served: tuple[PolicyServer, agl.Tracer], via: str
) -> None:
    command = [sys.executable, FAKE, "env"] + (["{task}"] if via == "arg" else [])
    agent = agl.CommandAgent(command, task_via=via, network="host", timeout=60)  # type: ignore[arg-type]
    _, _, spans = run(served, agent, task={"prompt": "fix the bug", "answer": 4})
    out = json.loads(harness_output(spans)["stdout"])
    assert out["task"] == "fix the bug"
    assert ("TASK.md" in out["files"]) == (via == "file")


def test_the_environment_holds_the_rollout_endpoint_and_none_of_the_callers_secrets(
    served: tuple[PolicyServer, agl.Tracer], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-users-own")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hidden")
    agent = agl.CommandAgent([sys.executable, FAKE, "env"], network="host", env={"EXTRA": "1"}, timeout=60)
    _, rid, spans = run(served, agent)
    env = json.loads(harness_output(spans)["stdout"])["env"]
    port = served[0].port
    assert env["OPENAI_BASE_URL"] == f"http://127.0.0.1:{port}/rollout/{rid}/v1"
    assert env["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}/rollout/{rid}"
    assert env["OPENAI_API_KEY"] == env["ANTHROPIC_AUTH_TOKEN"] == "agl-no-key"
    assert env["AGL_ROLLOUT_ID"] == rid and env["AGL_SIDE_MODEL"] == "scripted@side"
    assert env["EXTRA"] == "1" and "AWS_SECRET_ACCESS_KEY" not in env
    assert "sk-the-users-own" not in json.dumps(env)
    assert env["HOME"] != str(Path.home()) and env["HOME"].endswith("/home")


def test_inside_the_sandbox_only_the_servers_port_is_reachable(
    served: tuple[PolicyServer, agl.Tracer],
) -> None:
    needs_isolation()
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(1)
    try:
        port = served[0].port
        other_port = other.getsockname()[1]
        agent = agl.CommandAgent(
            [
                sys.executable,
                FAKE,
                "net",
                "{task}",
                f"127.0.0.1:{port}",
                f"127.0.0.1:{other_port}",
                "192.0.2.1:80",
            ],
            timeout=60,
        )
        _, _, spans = run(served, agent)
    finally:
        other.close()
    out = json.loads(harness_output(spans)["stdout"])
    assert out["interfaces"] == ["lo"]
    reach = out["reach"]
    assert reach[f"127.0.0.1:{port}"] == "connected"  # the bridged server port
    # the host's other ports are not there
    assert reach[f"127.0.0.1:{other_port}"] == "ConnectionRefusedError"
    assert reach["192.0.2.1:80"] in ("OSError", "TimeoutError")  # no route out (ENETUNREACH)


def test_a_fresh_workdir_copied_from_the_template_and_the_verifier_gives_the_reward(
    served: tuple[PolicyServer, agl.Tracer], tmp_path: Path
) -> None:
    (tmp_path / "tpl").mkdir()
    (tmp_path / "tpl" / "README").write_text("template")
    verifier = [
        sys.executable,
        "-c",
        "import os; print('log line'); print(0.25 if os.path.exists('beat') else 0.5)",
    ]
    agent = agl.CommandAgent(
        [sys.executable, FAKE, "env"],
        template=tmp_path / "tpl",
        verifier=verifier,
        network="host",
        timeout=60,
    )
    reward, rid, spans = run(served, agent)
    assert reward == 0.5
    assert json.loads(harness_output(spans)["stdout"])["files"] == ["README"]
    (ver,) = [s for s in spans if s.name == "verifier"]
    assert ver.kind == "tool" and ver.status == "ok" and ver.output["exit_code"] == 0
    assert served[0].store.get_rollout(rid).reward == 0.5  # type: ignore[union-attr]
    failing = agl.CommandAgent(
        [sys.executable, FAKE, "env"], verifier=[sys.executable, "-c", "raise SystemExit(1)"], network="host"
    )
    assert run(served, failing)[0] == 0.0


def test_a_reward_function_gets_the_result_and_a_failed_exit_is_an_error_span(
    served: tuple[PolicyServer, agl.Tracer],
) -> None:
    seen: list[agl.harness.HarnessResult] = []

    def reward(result: agl.harness.HarnessResult) -> float:
        seen.append(result)
        return 0.75

    agent = agl.CommandAgent([sys.executable, FAKE, "fail"], reward=reward, network="host", timeout=60)
    value, _, spans = run(served, agent)
    assert value == 0.75 and seen[0].exit_code == 3 and not seen[0].timed_out
    (span,) = [s for s in spans if s.name == "harness"]
    assert span.status == "error" and "exit code 3" in (span.error or "")
    assert agl.CommandAgent([sys.executable, FAKE, "fail"], network="host")("t", served[0].llm()) == 0.0


@pytest.mark.parametrize("network", ["host", "isolated"])
def test_the_time_limit_ends_the_whole_process_group(
    served: tuple[PolicyServer, agl.Tracer], network: str
) -> None:
    if network == "isolated":
        needs_isolation()
    agent = agl.CommandAgent([sys.executable, FAKE, "hang"], network=network, timeout=2)  # type: ignore[arg-type]
    start = time.monotonic()
    reward, _, spans = run(served, agent)
    assert time.monotonic() - start < 15
    assert reward == 0.0
    out = harness_output(spans)
    assert out["timed_out"] is True and out["exit_code"] is None
    assert [s.status for s in spans if s.name == "harness"] == ["error"]


def test_in_the_sandbox_even_a_detached_daemon_ends_with_the_run(
    served: tuple[PolicyServer, agl.Tracer], tmp_path: Path
) -> None:
    needs_isolation()
    agent = agl.CommandAgent(
        [sys.executable, FAKE, "daemon"], workdir_root=tmp_path, keep_workdirs=True, timeout=60
    )
    assert run(served, agent)[0] == 1.0
    (beat,) = tmp_path.glob("*/work/beat")
    time.sleep(0.5)
    size = beat.stat().st_size
    time.sleep(0.6)
    assert beat.stat().st_size == size  # the daemon (its own session) was ended with the namespace


def test_workdirs_are_removed_unless_kept(served: tuple[PolicyServer, agl.Tracer], tmp_path: Path) -> None:
    agent = agl.CommandAgent([sys.executable, FAKE, "env"], network="host", workdir_root=tmp_path)
    run(served, agent)
    assert list(tmp_path.iterdir()) == []


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="task_via"):
        agl.CommandAgent(["x"], task_via="pipe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="network"):
        agl.CommandAgent(["x"], network="none")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="command"):
        agl.CommandAgent([])


def test_a_program_that_cannot_start_still_records_its_harness_span(tmp_path: Path) -> None:
    store = agl.SQLiteStore(tmp_path / "spans.db")
    missing = str(tmp_path / "no-such-cli")
    agent = agl.CommandAgent(
        [missing, "--print", "{task}"], network="host", workdir_root=tmp_path / "runs", keep_workdirs=True
    )
    with PolicyServer(engines.ScriptedEngine(["unused"]), store) as server:
        tracer = agl.Tracer(store)
        with pytest.raises(FileNotFoundError), tracer.rollout("add 2 and 2") as ro:
            agent("add 2 and 2", server.llm(ro.id))
    store.flush()
    (span,) = [s for s in store.spans(ro.id) if s.kind == "agent" and s.name == "harness"]
    assert span.status == "error"
    assert span.error is not None and span.error.startswith(f"{missing}: cannot run: FileNotFoundError")
    assert span.input["command"] == [missing, "--print", "add 2 and 2"]
    (workdir,) = (tmp_path / "runs").glob("*/work")
    assert span.input["cwd"] == str(workdir) and span.input["network"] == "host"
    assert span.attributes == {"harness": True}
    rollout = store.get_rollout(ro.id)
    assert rollout is not None and rollout.status == "failed" and "no-such-cli" in (rollout.error or "")


def test_a_verifier_that_cannot_start_still_records_its_span(served: tuple[PolicyServer, agl.Tracer]) -> None:
    agent = agl.CommandAgent([sys.executable, FAKE, "env"], network="host", verifier=["/nonexistent/verify"])
    server, tracer = served
    with pytest.raises(FileNotFoundError), tracer.rollout("t") as ro:
        agent("t", server.llm(ro.id))
    spans = server.store.spans(ro.id)
    assert [(s.name, s.status) for s in spans if s.kind in ("agent", "tool")] == [
        ("harness", "ok"),
        ("verifier", "error"),
    ]
    (verifier,) = [s for s in spans if s.name == "verifier"]
    assert verifier.input == {"command": ["/nonexistent/verify"]}
    assert (verifier.error or "").startswith("verifier: FileNotFoundError")
