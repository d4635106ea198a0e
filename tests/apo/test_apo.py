"""agl.APO over the trainer's rollout machinery, with a scripted policy and a scripted reflection model
served over HTTP on 127.0.0.1: it finds the better prompt, optimises only the named components, reads
a LangChain agent's prompt, shows the reflection model the tool errors, and resumes after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.apo import candidate_id

from .helpers import DIGITS, adder, propose_digits, run_apo, sum_agent, sums, system_of

SRC = str(Path(__file__).resolve().parents[2] / "src")


def apo_rollouts(store: agl.Store) -> list[agl.Rollout]:
    return [r for r in store.rollouts() if "apo" in r.metadata]


def test_apo_finds_the_better_prompt_within_its_budget(reflector: Any, tmp_path: Path) -> None:
    server = reflector()
    result, store, rows = run_apo(
        sum_agent, sums(3), sums(3, start=10), tmp_path, reflection=server.llm, budget=20
    )
    assert result["apo/seed_val_score"] == 0.0 and result["apo/best_val_score"] == 1.0
    assert result["prompts"] == {"system": DIGITS}
    saved = json.loads((tmp_path / "prompts.json").read_text())
    assert saved["prompts"] == {"system": DIGITS} and saved["val_score"] == 1.0
    assert agl.APO.load(tmp_path) == {"system": DIGITS}
    # the budget: GEPA stops once its evaluations reach it (the last iteration may go past it by two
    # minibatches and, when its proposal is accepted, the validation set)
    assert result["apo/metric_calls"] <= 20 + 2 * 3 + 3
    assert result["apo/rollouts_run"] <= result["apo/metric_calls"] + 1  # + the probe rollout
    # every evaluation is a traced rollout naming its candidate, whose texts it ran with
    ros = apo_rollouts(store)
    assert len(ros) == result["apo/rollouts_run"]
    seed_id, best_id = (
        candidate_id({"system": "You are a helpful assistant."}),
        candidate_id({"system": DIGITS}),
    )
    for ro in ros:
        meta = ro.metadata["apo"]
        assert ro.mode == ("val" if meta["split"] == "val" else "train")
        if meta["candidate"] == best_id:
            assert ro.metadata["prompts"] == {"system": DIGITS} and meta["parent"] == seed_id
            assert ro.reward == 1.0
        llm = [s for s in store.spans(ro.rollout_id) if s.kind == "llm"]
        assert system_of(llm[0].input) == ro.metadata.get("prompts", {}).get(
            "system", "You are a helpful assistant."
        )
    # the candidates, their parents, texts and per-task scores
    run = json.loads((tmp_path / "apo" / "latest.json").read_text())["run"]
    cands = [json.loads(x) for x in (tmp_path / "apo" / run / "candidates.jsonl").read_text().splitlines()]
    accepted = [c for c in cands if c["accepted"]]
    assert [(c["id"], c["parent"], c["val_score"]) for c in accepted] == [
        (seed_id, None, 0.0),
        (best_id, seed_id, 1.0),
    ]
    assert accepted[1]["task_scores"] == {"0": 1.0, "1": 1.0, "2": 1.0}
    logged = [r for r in rows if r.get("apo/accepted") == 1.0]
    assert [r["apo/best_val_score"] for r in logged] == [0.0, 1.0]
    # the reflection model was called over HTTP with the traces: the question and the wrong answer
    assert server.requests[0]["model"] == "reflector" and server.requests[0]["auth"] == "Bearer rk"
    first = server.prompts()[0]
    assert "You are a helpful assistant." in first and "plus" in first and "scored 0" in first


def test_the_progress_bar_counts_the_budget_and_shows_the_best_score(
    reflector: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = reflector()
    result, _, _ = run_apo(sum_agent, sums(3), sums(3, start=10), tmp_path, reflection=server.llm, budget=20)
    assert result["apo/best_val_score"] == 1.0
    err = capsys.readouterr().err
    frames = [f for f in err.replace("\r", "\n").splitlines() if f.startswith("APO")]
    assert frames and "/20" in frames[-1]
    assert "best=0.000" in err and "best=1.000" in frames[-1] and "candidates=2" in frames[-1]


def two_agents(task: dict[str, Any], llm: agl.LLM) -> float:
    """A writer answers; a rewriter restates the writer's answer. Each reads its own system prompt."""
    writer, rewriter = llm.for_agent("writer"), llm.for_agent("rewriter")
    draft = (
        writer.openai_client(max_retries=0)
        .chat.completions.create(
            model=writer.model,
            messages=[
                {"role": "system", "content": writer.prompt("system", "Write an answer.")},
                {"role": "user", "content": task["q"]},
            ],
        )
        .choices[0]
        .message.content
    )
    final = (
        rewriter.openai_client(max_retries=0)
        .chat.completions.create(
            model=rewriter.model,
            messages=[
                {"role": "system", "content": rewriter.prompt("system", "REWRITER-KEEP")},
                {"role": "user", "content": f"Restate: {draft}"},
            ],
        )
        .choices[0]
        .message.content
    )
    return float((final or "").strip() == str(task["a"]))


def two_policy(messages: list[dict[str, Any]]) -> str:
    if system_of(messages).startswith("REWRITER"):
        return str(messages[-1]["content"]).removeprefix("Restate: ")
    return adder(messages)


def test_a_two_agent_system_optimises_only_the_named_component(reflector: Any, tmp_path: Path) -> None:
    server = reflector()
    result, store, _ = run_apo(
        two_agents,
        sums(3),
        sums(3, 20),
        tmp_path,
        policy=two_policy,
        reflection=server.llm,
        budget=16,
        components=["writer/system"],
    )
    assert result["prompts"] == {"writer/system": DIGITS}
    assert result["apo/best_val_score"] == 1.0
    # the rewriter's prompt was never a candidate: every rollout ran it with its default
    for ro in apo_rollouts(store):
        probe = ro.metadata["apo"]["candidate"] == "probe"  # the rollout that found the defaults
        assert set(ro.metadata["prompts"]) == (set() if probe else {"writer/system"})
        texts = {
            s.attributes["component"]: s.output for s in store.spans(ro.rollout_id) if s.name == "agl.prompt"
        }
        assert texts["rewriter/system"] == "REWRITER-KEEP"
    # the reflection model saw the writer's calls only
    assert server.prompts() and all(
        "REWRITER-KEEP" not in p and "Write an answer." in p for p in server.prompts()
    )


def test_a_langchain_agent_reads_its_prompt_and_is_optimised(reflector: Any, tmp_path: Path) -> None:
    pytest.importorskip("langchain_openai")
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_openai import ChatOpenAI

    def agent(task: dict[str, Any], llm: agl.LLM) -> float:
        chat = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
        system = agl.prompt("system", default="You are a friendly chatbot.")
        reply = chat.invoke([SystemMessage(system), HumanMessage(task["q"])])
        return float(str(reply.content).strip() == str(task["a"]))

    server = reflector()
    result, store, _ = run_apo(agent, sums(2), sums(2, 30), tmp_path, reflection=server.llm, budget=12)
    assert result["apo/seed_val_score"] == 0.0 and result["apo/best_val_score"] == 1.0
    assert result["prompts"] == {"system": DIGITS}
    assert "You are a friendly chatbot." in server.prompts()[0]
    best = [
        r for r in apo_rollouts(store) if r.metadata["apo"]["candidate"] == candidate_id({"system": DIGITS})
    ]
    assert best and all(r.reward == 1.0 for r in best)


def tool_agent(task: dict[str, Any], llm: agl.LLM) -> float:
    """Asks the policy which operator to use, then runs a calculator tool that only knows '+'."""
    system = llm.prompt("system", default="Pick an operator.")
    op = (
        llm.openai_client(max_retries=0)
        .chat.completions.create(
            model=llm.model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": task["q"]}],
        )
        .choices[0]
        .message.content
    )
    tracer = agl.Tracer.current_rollout().tracer  # type: ignore[union-attr]
    try:
        with tracer.span("tool", "calculator", input={"op": op, "args": [2, 3]}) as sp:
            if op != "+":
                raise ValueError(f"calculator: unsupported operator {op!r}; it knows only '+'")
            sp.set_output(5)
    except ValueError:
        return 0.0
    return 1.0


def test_the_reflective_dataset_holds_the_tool_error_text(reflector: Any, tmp_path: Path) -> None:
    def policy(messages: list[dict[str, Any]]) -> str:
        return "+" if "plus" in system_of(messages) else "^"

    def answer(prompt: str) -> str:
        return "```\nAlways pick plus: answer '+'.\n```"

    server = reflector(answer)
    result, _store, _ = run_apo(
        tool_agent,
        [{"q": "2 ? 3"}] * 2,
        [{"q": "2 ? 3 = 5"}],
        tmp_path,
        policy=policy,
        reflection=server.llm,
        budget=8,
    )
    assert result["apo/best_val_score"] == 1.0
    first = server.prompts()[0]
    assert (
        "calculator: unsupported operator '^'; it knows only '+'" in first
    )  # in the tool call and the feedback
    assert "Tool calls" in first and "Error" in first


def test_make_reflective_dataset_reads_the_spans(tmp_path: Path) -> None:
    from agentlightning_lite.apo.optimizer import GEPAAdapter, _Item

    _result, store, _ = run_apo(
        tool_agent,
        [{"q": "2 ? 3"}],
        None,
        tmp_path,
        policy=lambda m: "^",
        reflection=lambda p: "```\nsame\n```",
        budget=2,
    )
    adapter = GEPAAdapter(agl.APO(), "r", lambda specs: [], store, [agl.air.ToolStatus(error=-0.5)], 0.0, {})
    [ro] = [r for r in apo_rollouts(store) if r.metadata["apo"]["candidate"] != "probe"][:1]
    from agentlightning_lite.apo.optimizer import _Done

    done = _Done(ro.rollout_id, 0.0, ro.status, ro.error, ro.reward)
    batch = type("B", (), {"trajectories": [{"item": _Item("train", 0, {"q": "2 ? 3"}), "done": done}]})()
    data = adapter.make_reflective_dataset({"system": "Pick an operator."}, batch, ["system"])
    [rec] = data["system"]
    assert rec["Calls"][0]["Input"][0] == "system: Pick an operator." and rec["Calls"][0]["Output"].endswith(
        "^"
    )
    assert rec["Tool calls"][0]["Tool"] == "calculator"
    assert "unsupported operator '^'" in rec["Tool calls"][0]["Error"]
    assert rec["Intermediate rewards"] == [{"Name": "tool_error:calculator", "Value": -0.5, "Call": 0}]
    assert rec["Score"] == 0.0 and "Tool 'calculator' failed with" in rec["Feedback"]


KILLED_RUN = """
import sys, time
sys.path.insert(0, {helpers!r})
import agentlightning_lite as agl
import helpers

def slow_agent(task, llm):
    time.sleep(0.3)
    return helpers.sum_agent(task, llm)

helpers.run_apo(slow_agent, helpers.sums(3), helpers.sums(3, start=10), {out!r},
                store=agl.SQLiteStore({db!r}), reflection=helpers.propose_digits, budget=20)
"""


def finished(store: agl.Store) -> Counter[tuple[str, str, int]]:
    """(candidate, split, task) -> how many finished evaluations the store holds."""
    return Counter(
        (r.metadata["apo"]["candidate"], r.metadata["apo"]["split"], r.metadata["apo"]["task_index"])
        for r in apo_rollouts(store)
        if r.status == "succeeded"
    )


@pytest.mark.slow
def test_a_run_killed_midway_resumes_without_redoing_finished_evaluations(tmp_path: Path) -> None:
    # the run as it goes uninterrupted
    reference, ref_store, _ = run_apo(
        sum_agent, sums(3), sums(3, start=10), tmp_path / "ref", reflection=propose_digits, budget=20
    )
    # the same run in a process killed once 7 evaluations are in its SQLite store
    out, db = tmp_path / "run", tmp_path / "runs.db"
    code = KILLED_RUN.format(helpers=str(Path(__file__).parent), out=str(out), db=str(db))
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, "PYTHONPATH": SRC},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    before: Counter[tuple[str, str, int]] = Counter()
    while time.monotonic() < deadline and proc.poll() is None:
        if db.exists():
            with agl.SQLiteStore(db) as peek:
                before = finished(peek)
            if sum(before.values()) >= 7:
                break
        time.sleep(0.1)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:] if proc.stderr else ""
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    with agl.SQLiteStore(db) as peek:
        before = finished(peek)
    assert 7 <= sum(before.values()) < sum(finished(ref_store).values())
    # resumed in this process: the finished evaluations come from the store, the rest run
    store = agl.SQLiteStore(db)
    result, store, _ = run_apo(
        sum_agent,
        sums(3),
        sums(3, start=10),
        out,
        store=store,
        reflection=propose_digits,
        budget=20,
        resume=True,
    )
    after = finished(store)
    assert set(after.values()) == {1}, "an evaluation was run twice"
    assert after.keys() == finished(ref_store).keys()  # the same evaluations as the uninterrupted run
    assert result["apo/rollouts_run"] == sum(after.values()) - sum(before.values())
    for key in ("prompts", "apo/best_val_score", "apo/seed_val_score", "apo/metric_calls", "apo/candidates"):
        assert result[key] == reference[key], key
    # what the killed process left running is marked interrupted, not left running
    assert not [r for r in store.rollouts() if r.status == "running"]
    store.close()
