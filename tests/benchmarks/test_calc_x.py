"""Calc-X benchmark: safe calculator, reward, data, and the AutoGen agent against a real PolicyServer."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.adapters import autogen as agl_autogen
from agentlightning_lite.serving import PolicyServer, engines

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.calc_x import AIR, CREDIT, agent, load_dataset, make_agent  # noqa: E402
from benchmarks.calc_x.__main__ import main  # noqa: E402
from benchmarks.calc_x.calculator import calculator, evaluate  # noqa: E402
from benchmarks.calc_x.data import ENGLISH_SOURCES, select  # noqa: E402
from benchmarks.calc_x.reward import extract_answer, parse_gold, score  # noqa: E402

from benchmarks import _harness  # noqa: E402

DATA = _harness.SHARED_DATA
needs_data = pytest.mark.skipif(not (DATA / "calcx").is_dir(), reason=f"no Calc-X data in {DATA}")


# -- calculator -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("2 + 3 * 4", "14"),
        ("-(7 - 10) / 2", "1.5"),
        ("(2/5) * (3/10)", "0.12"),
        ("1/3 * 3", "1"),  # exact rational arithmetic
        ("2 ^ 10", "1024"),
        ("1,000 * 3", "3000"),
        ("17 % 5 + 17 // 5", "5"),
        ("sqrt(16/9)", "1.333333333"),
        ("0.1 + 0.2", "0.3"),
        ("2 ** -2", "0.25"),
    ],
)
def test_calculator_values(expression: str, value: str) -> None:
    assert calculator(expression) == value


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("__import__('os').system('true')", "not arithmetic"),
        ("open('/etc/passwd').read()", "not arithmetic"),
        ("(1).__class__", "not arithmetic"),
        ("x + 1", "not arithmetic"),
        ("'a' * 3", "not a number"),
        ("True + 1", "not a number"),
        ("[1, 2]", "not arithmetic"),
        ("lambda: 1", "not arithmetic"),
        ("2 ** 65", "exponents are limited"),
        ("9 ** 9 ** 9", "exponents are limited"),
        ("10 ** 31", "larger than"),
        ("1e20 * 1e20", "larger than"),
        ("1 / 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("sqrt(-4)", "negative"),
        ("(-8) ** 0.5", "not a real number"),
        ("1 + ", "not a valid expression"),
        ("", "empty"),
        ("1+" * 150 + "1", "longer than 200"),
    ],
)
def test_calculator_rejects(expression: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        evaluate(expression)


# -- reward ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "result", "expected"),
    [
        ("### ANSWER: 84 ###", "84", 1.0),
        ("### ANSWER: 85 ###", "84", 0.0),
        ("12 * 7 = 84, so 84 pencils.", "84", 1.0),  # no marker: the last number
        ("### ANSWER: 84 ### (I used 12 and 7)", "84", 1.0),  # the marker wins over later numbers
        ("### ANSWER: 4,547.2 ###", "4_547.2", 1.0),
        ("### ANSWER: 1.475817 ###", "1_129/765", 1.0),  # within the relative 1e-4
        ("### ANSWER: 1.4758 ###", "1_129/765", 1.0),
        ("### ANSWER: 1.47 ###", "1_129/765", 0.0),
        ("### ANSWER: 2/3 ###", "2/3", 1.0),
        ("### ANSWER: 0.67 ###", "2/3", 0.0),
        ("### ANSWER: 1 1/2 ###", "3/2", 1.0),
        ("### ANSWER: $14.57 ###", "14.57", 1.0),
        ("### ANSWER: 25% ###", "1/4", 1.0),
        ("### ANSWER: 25% ###", "25", 1.0),
        ("### ANSWER: -16 ###", "-16", 1.0),
        ("### ANSWER: 16 ###", "-16", 0.0),
        ("### ANSWER: 0.0000005 ###", "0", 1.0),  # the absolute 1e-6
        ("### ANSWER: 0.00001 ###", "0", 0.0),
        ("I don't know.", "84", 0.0),
        ("", "84", 0.0),
    ],
)
def test_score(reply: str, result: str, expected: float) -> None:
    assert score(reply, result) == expected


def test_score_multiple_choice() -> None:
    q = "36 men finish in 18 days. How many days for 108 men?\nPick one:\nA) 24\nB) 77\nC) 6\nD) 29\nE) 21"
    assert score("### ANSWER: C ###", "C", q) == 1.0
    assert score("### ANSWER: (C) ###", "C", q) == 1.0
    assert score("### ANSWER: 6 days ###", "C", q) == 1.0  # the value of option C
    assert score("### ANSWER: A ###", "C", q) == 0.0
    assert score("### ANSWER: 24 ###", "C", q) == 0.0


def test_extract_answer_and_gold() -> None:
    assert extract_answer("step 1: 3 ### ANSWER: 7 ###") == "7"
    assert extract_answer("### ANSWER: 5 ###\n### ANSWER: 6 ###") == "6"  # the last one
    assert extract_answer("no numbers") is None
    assert parse_gold("3_628_799/3_628_800") == pytest.approx(1 - 1 / 3_628_800)
    assert parse_gold("D") == "D"
    with pytest.raises(ValueError, match="not a Calc-X result"):
        parse_gold("n/a")


@needs_data
def test_every_gold_result_scores_itself() -> None:
    for split in ("train", "test"):
        for task in load_dataset(split, DATA):
            gold = task["result"]
            assert score(f"### ANSWER: {gold} ###", gold, task["question"]) == 1.0, task
            if not isinstance(parse_gold(gold), str):
                written = gold.replace("_", ",")
                assert score(f"So the answer is {written}.", gold) == 1.0, task


# -- data -----------------------------------------------------------------------------------------
@needs_data
def test_load_dataset_splits() -> None:
    train, test = load_dataset("train", DATA), load_dataset("test", DATA)
    assert (len(train), len(test)) == (8192, 500)
    assert not {t["id"] for t in train} & {t["id"] for t in test}
    assert Counter(t["source_ds"] for t in test) == {
        "ape210k": 157,
        "gsm8k": 106,
        "asdiv_a": 100,
        "svamp": 75,
        "mawps": 39,
        "aqua_rat": 23,
    }
    first = train[0]
    assert sorted(first) == ["calc_steps", "chain", "id", "question", "result", "source_ds"]
    assert first["id"] == "ape210k__00384263" and first["result"] == "2/3" and first["calc_steps"] == 3
    assert load_dataset("test", DATA / "calcx") == test  # the folder itself works too


@needs_data
def test_select_easiest_is_deterministic_and_numeric() -> None:
    test = load_dataset("test", DATA)
    easy = select(test, 24, "easiest")
    assert easy == select(list(reversed(test)), 24, "easiest")
    assert all(t["calc_steps"] == 1 and not isinstance(parse_gold(t["result"]), str) for t in easy)
    lengths = [len(t["question"]) for t in easy]
    assert lengths == sorted(lengths)
    assert select(test, 3, "first") == test[:3]
    with pytest.raises(ValueError, match="'first', 'easiest', 'word-problems' or 'english'"):
        select(test, 3, "random")


@needs_data
def test_select_word_problems_are_one_step_stories_in_a_fixed_order() -> None:
    train = load_dataset("train", DATA)
    stories = select(train, 40, "word-problems")
    assert len(stories) == 40 and stories == select(list(reversed(train)), 40, "word-problems")
    assert all(t["calc_steps"] == 1 and not isinstance(parse_gold(t["result"]), str) for t in stories)
    assert all(len(t["question"].split()) >= 12 for t in stories)
    assert len({t["source_ds"] for t in select(train, 900, "word-problems")}) == 3  # a mix, not one source


@needs_data
def test_select_english_keeps_one_step_stories_of_the_english_sources() -> None:
    train = load_dataset("train", DATA)
    english = select(train, 100, "english")
    assert 16 <= len(english) < 100  # the train split has few: ape210k makes up the rest
    assert {t["source_ds"] for t in english} <= ENGLISH_SOURCES
    assert all(t["calc_steps"] == 1 and not isinstance(parse_gold(t["result"]), str) for t in english)
    assert english == select(list(reversed(train)), 100, "english")
    assert "ape210k" in {t["source_ds"] for t in select(train, 100, "word-problems")}


def test_load_dataset_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="split must be one of"):
        load_dataset("dev", tmp_path)
    with pytest.raises(FileNotFoundError, match=r"calcx_agentlightning_train\.jsonl"):
        load_dataset("train", tmp_path)


# -- the agent against a real PolicyServer --------------------------------------------------------
def call(expression: Any, argument: str = "expression") -> dict[str, Any]:
    return {"tool_calls": [{"name": "calculator", "arguments": {argument: expression}}]}


def episode(
    replies: list[Any], task: dict[str, Any], **settings: Any
) -> tuple[float, agl.MemoryStore, str, list[list[dict[str, Any]]], dict[str, float]]:
    """One rollout of the agent on a ScriptedEngine; returns reward, store, rollout id, requests, metrics."""
    requests: list[list[dict[str, Any]]] = []

    def reply(messages: list[dict[str, Any]]) -> Any:
        requests.append(messages)
        return replies[len(requests) - 1]

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    sink: list[dict[str, float]] = []
    run = _harness._with_metrics(make_agent(**settings) if settings else agent, sink, threading.Lock())
    with PolicyServer(engines.ScriptedEngine(reply, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            reward = asyncio.run(run(task, server.llm(ro.id)))
            ro.reward(reward)
    return reward, store, ro.id, requests, sink[0]


TASK = {"id": "t1", "question": "How much is 504 divided by 4?", "result": "126"}


def test_tool_call_becomes_tool_span_and_air_rewards_the_calling_transition() -> None:
    reward, store, rid, requests, metrics = episode([call("504 / 4"), "### ANSWER: 126 ###"], TASK)
    assert reward == 1.0
    spans = store.spans(rid)
    tools = [s for s in spans if s.kind == "tool"]
    assert [(s.name, s.agent, s.status, s.output, s.input) for s in tools] == [
        ("calculator", "calc", "ok", "126", {"expression": "504 / 4"})
    ]
    assert [s.name for s in spans if s.kind == "agent"] == ["calc"]
    # the first request shows the model the system prompt, the worked example and the question
    first = requests[0]
    assert first[0]["role"] == "system" and "### ANSWER: <number> ###" in first[0]["content"]
    assert first[2]["tool_calls"][0]["function"]["name"] == "calculator"  # the example's call
    assert first[-1]["content"] == TASK["question"]
    assert requests[1][-1] == {
        "role": "tool",
        "content": "126",
        "tool_call_id": tools[0].attributes["tool_call_id"],
    }
    ts = agl.transitions(store, air=AIR, credit=CREDIT)
    assert [t.agent for t in ts] == ["calc", "calc"] and all(t.response_token_ids for t in ts)
    assert ts[0].metadata["intermediate_rewards"] == [("tool_ok:calculator", 0.1)]
    assert ts[1].metadata["intermediate_rewards"] == []
    assert [round(t.reward, 6) for t in ts] == [1.1, 1.0]
    assert metrics.pop("_task") == json.dumps(TASK, sort_keys=True)  # which task: for paired tests
    assert metrics == {"tool_calls": 1.0, "tool_errors": 0.0, "answer_format": 1.0, "reward": 1.0}


@pytest.mark.parametrize(
    "bad_call",
    [call("504 /"), call("__import__('os')"), call("504 / 4", argument="expr")],
    ids=["syntax", "not-arithmetic", "wrong-argument"],
)
def test_malformed_calculator_call_is_an_error_span_with_negative_reward(bad_call: dict[str, Any]) -> None:
    reward, store, rid, requests, metrics = episode([bad_call, "### ANSWER: 120 ###"], TASK)
    assert reward == 0.0
    tools = [s for s in store.spans(rid) if s.kind == "tool"]
    assert [(t.name, t.status) for t in tools] == [("calculator", "error")]
    assert tools[0].error
    assert requests[1][-1]["role"] == "tool"  # the model sees the error and may retry
    ts = agl.transitions(store, air=AIR, credit=CREDIT)
    assert ts[0].metadata["intermediate_rewards"] == [("tool_error:calculator", -0.1)]
    assert [round(t.reward, 6) for t in ts] == [-0.1, 0.0]
    assert metrics["tool_calls"] == 1.0 and metrics["tool_errors"] == 1.0


def test_at_most_three_tool_turns_then_an_answer_without_tools() -> None:
    replies = [call("500 + 4"), call("504 / 4"), call("126 * 1"), "### ANSWER: 126 ###"]
    reward, store, rid, requests, metrics = episode(replies, TASK)
    assert reward == 1.0 and len(requests) == 4
    assert [s.status for s in store.spans(rid) if s.kind == "tool"] == ["ok", "ok", "ok"]
    ts = agl.transitions(store, air=AIR, credit=CREDIT)
    assert [round(t.reward, 6) for t in ts] == [1.1, 1.1, 1.1, 1.0]
    assert metrics["tool_calls"] == 3.0


def test_settings_reach_the_server_and_instrumentation_survives_uninstrument() -> None:
    agl_autogen.uninstrument()  # e.g. another library removed it: the agent installs it again
    reward, store, rid, _, _ = episode(["### ANSWER: 126 ###"], TASK, temperature=0.0, max_tokens=40)
    assert reward == 1.0
    spans = store.spans(rid)
    server = [s for s in spans if s.kind == "llm" and s.attributes.get("server") == "agl"]
    framework = [s for s in spans if s.kind == "llm" and s.attributes.get("agl.source") == "autogen"]
    assert len(server) == 1 and len(framework) == 1
    assert framework[0].attributes["agl.duplicate_of"] == server[0].span_id  # joined to the token-level span
    params = server[0].attributes["params"]
    assert params["temperature"] == 0.0 and params["max_tokens"] == 40


def test_cli_loads_the_benchmark(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentlightning_lite.cli import load_agent

    monkeypatch.chdir(ROOT)
    loaded, module = load_agent("calc_x")
    assert loaded is agent and module.load_dataset is load_dataset


# -- the whole benchmark, end to end ---------------------------------------------------------------
@needs_data
@pytest.mark.slow
def test_benchmark_one_step_end_to_end(tmp_path: Path, tiny_smol: Path) -> None:
    """The benchmark's command line on the tiny Llama with SmolLM2's tokenizer and chat template (what is
    checked is the run's plumbing and results, not what the model answers)."""
    results = main(
        [
            "--model",
            str(tiny_smol),
            "--data-dir",
            str(DATA),
            "--train-size",
            "1",
            "--test-size",
            "2",
            "--steps",
            "1",
            "--batch-size",
            "1",
            "--group-size",
            "2",
            "--max-tokens",
            "24",
            "--max-tool-turns",
            "1",
            "--no-record",
            "--bf16",
            "--output-dir",
            str(tmp_path),
        ]
    )
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["benchmark"] == "calc_x" and saved["steps"] == 1 and saved["test_size"] == 2
    assert (tmp_path / "reward_curve.png").stat().st_size > 0
    for phase in ("before", "after"):
        res = results[phase]
        assert res["n"] == 2 and res["failed"] == 0
        assert 0.0 <= res["mean_reward"] <= 1.0 and 0.0 <= res["success_rate"] <= 1.0
        assert 0.0 <= res["answer_format"] <= 1.0 and 0.0 <= res["tool_calls"] <= 1.0
        # each held-out task's own reward, in the test set's order (for paired before/after tests)
        assert len(res["per_task"]) == 2 and all(r is not None for r in res["per_task"])
        assert sum(res["per_task"]) / 2 == pytest.approx(res["mean_reward"])


# -- the teacher (SFT warm start): the gold chain through the real agent ------------------------------
@needs_data
def test_teacher_replays_the_gold_chain_through_the_agent() -> None:
    from benchmarks.calc_x.teacher import teacher_reply

    task = next(t for t in load_dataset("train", DATA) if t["calc_steps"] == 2 and t["result"].isdigit())
    script = teacher_reply({task["question"]: task})
    assert script([{"role": "user", "content": "an unknown question"}]) == "### ANSWER: 0 ###"
    replies: list[Any] = []

    def reply(messages: list[dict[str, Any]]) -> Any:
        out = script(messages)
        replies.append(out)
        return out

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    with PolicyServer(engines.ScriptedEngine(reply, tokenizer="bytes"), store) as server:
        with tracer.rollout(task) as ro:
            got = asyncio.run(agent(task, server.llm(ro.id)))
            ro.reward(got)
    assert got == 1.0
    calls = [s for s in store.spans(ro.id) if s.kind == "tool"]
    assert [s.status for s in calls] == ["ok", "ok"]  # both gold calculator steps ran
    assert replies[-1] == f"### ANSWER: {calls[-1].output} ###"
    ts = agl.transitions(store, rollout_ids=[ro.id])
    assert len(ts) == 3 and all(t.response_token_ids for t in ts)
