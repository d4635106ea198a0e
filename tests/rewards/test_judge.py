"""agl.rewards.Judge against real OpenAI-compatible servers on 127.0.0.1 (a PolicyServer whose scripted
engine writes the judge's replies), on its own and as the reward of a training step."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rewards import Judge, JudgeParseError

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("openai")  # the policy calls in these tests: imported here, not inside the first test

from agentlightning_lite.serving import PolicyServer, engines

RUBRIC = "The reply gives the correct sum as a number."


def is_judge(messages: list[dict[str, Any]]) -> bool:
    return messages[0]["role"] == "system" and "grader" in messages[0]["content"]


def test_a_score_from_an_openai_compatible_endpoint() -> None:
    seen: list[list[dict[str, Any]]] = []

    def judge_model(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return "The sum is right but the reply is terse.\nScore: 8/10"

    store = agl.MemoryStore()
    with PolicyServer(engines.ScriptedEngine(judge_model, tokenizer="bytes"), store) as server:
        judge = Judge(RUBRIC, base_url=server.base_url, model=server.model_name, api_key="k")
        assert judge("What is 2+2?", "4") == 0.8
        assert judge({"q": "What is 3+3?"}, "6") == 0.8
    assert len(seen) == 2 and "Score: N/10" in seen[0][0]["content"]
    assert seen[0][1]["content"] == f"Rubric:\n{RUBRIC}\n\nTask:\nWhat is 2+2?\n\nReply:\n4"
    assert '"q": "What is 3+3?"' in seen[1][1]["content"]
    # the usage the judge adds up is the server's usage field of each response
    calls = [s for r in store.rollouts() for s in store.spans(r.rollout_id) if s.kind == "llm"]
    assert len(calls) == 2 and all(r.mode == "trace" for r in store.rollouts())  # never training data
    assert judge.usage.calls == 2 and judge.usage.replies == 2 and judge.usage.unparsed == 0
    assert judge.usage.prompt_tokens == sum(c.attributes["usage"]["prompt_tokens"] for c in calls) > 0
    assert judge.usage.completion_tokens == sum(c.attributes["usage"]["completion_tokens"] for c in calls)
    assert judge.usage.per_reply()["calls"] == 1.0


def test_the_policy_as_judge_is_a_side_call_never_trained() -> None:
    def model(messages: list[dict[str, Any]]) -> str:
        return "Correct.\nScore: 6/10" if is_judge(messages) else "4"

    store = agl.MemoryStore()
    tracer = agl.Tracer(store)
    judge = Judge(RUBRIC)  # no endpoint of its own: the rollout's llm, as side calls
    with PolicyServer(engines.ScriptedEngine(model, tokenizer="bytes"), store) as server:
        with tracer.rollout("What is 2+2?", mode="train") as ro:
            llm = server.llm(ro.id)
            reply = llm.openai_client(max_retries=0).chat.completions.create(
                model=llm.model, messages=[{"role": "user", "content": "What is 2+2?"}]
            )
            ro.reward(judge("What is 2+2?", reply.choices[0].message.content, llm=llm))
    assert store.get_rollout(ro.id).reward == 0.6
    calls = [s for s in store.spans(ro.id) if s.kind == "llm"]
    assert [c.agent for c in calls] == [None, "side"]  # both recorded in the rollout
    [transition] = agl.transitions(store)  # only the policy's call is training data
    assert transition.response["content"] == "4" and transition.final_reward == 0.6
    assert agl.transitions(store, side_calls=True)[1].agent == "side"  # it is there, left out on purpose
    [span] = [s for s in store.spans(ro.id) if s.kind == "custom" and s.name == "judge"]
    assert span.output["text"].endswith("Score: 6/10")
    assert span.output["usage"]["prompt_tokens"] == calls[1].attributes["usage"]["prompt_tokens"]
    with pytest.raises(ValueError, match="has no endpoint"):
        judge("What is 2+2?", "4")  # no llm: nowhere to ask


def test_an_unreadable_score_raises_or_falls_back_and_is_counted(caplog: pytest.LogCaptureFixture) -> None:
    replies = iter(["Looks good to me.", "Score: 11/10", "Fine.", "Score: 9/10"])
    with PolicyServer(engines.ScriptedEngine(lambda m: next(replies), tokenizer="bytes")) as server:
        strict = Judge(RUBRIC, base_url=server.base_url, model=server.model_name)
        with pytest.raises(JudgeParseError, match="no score in the format `Score: N/10`") as err:
            strict("2+2?", "4")
        assert err.value.reply == "Looks good to me."
        with pytest.raises(JudgeParseError, match="unparsed = 2"):
            strict("2+2?", "4")  # out of range is no score
        lenient = Judge(RUBRIC, base_url=server.base_url, model=server.model_name, fallback=0.25)
        with caplog.at_level(logging.WARNING, logger="agentlightning_lite.rewards.judge"):
            assert lenient("2+2?", "4") == 0.25
        assert "scored 0.25 (fallback)" in caplog.text and lenient.usage.unparsed == 1
        assert lenient("2+2?", "4") == 0.9 and lenient.usage.unparsed == 1 and lenient.usage.calls == 2
    assert strict.usage.unparsed == 2 and strict.usage.calls == 2


def test_a_group_scored_in_one_call() -> None:
    seen: list[str] = []
    answers = iter(
        [
            "Reply 2 is off by one.\nReply 1: Score: 10/10\nReply 2: Score: 3/10\nReply 3: Score: 0/10",
            "Reply 1: Score: 10/10\nReply 3: Score: 1/10",
        ]
    )

    def judge_model(messages: list[dict[str, Any]]) -> str:
        seen.append(messages[1]["content"])
        return next(answers)

    with PolicyServer(engines.ScriptedEngine(judge_model, tokenizer="bytes")) as server:
        judge = Judge(RUBRIC, base_url=server.base_url, model=server.model_name)
        assert judge.score_group("What is 2+2?", ["4", "5", "22"]) == [1.0, 0.3, 0.0]
        assert judge.usage.calls == 1 and judge.usage.replies == 3
        assert all(f"Reply {i}:\n{r}" in seen[0] for i, r in [(1, "4"), (2, "5"), (3, "22")])
        with pytest.raises(JudgeParseError, match=r"for replies \[2\]"):
            judge.score_group("What is 2+2?", ["4", "5", "22"])
        assert judge.score_group("What is 2+2?", []) == [] and judge.usage.calls == 2
    assert judge.usage.per_reply()["calls"] == pytest.approx(2 / 6)


def test_endpoint_errors_say_what_happened() -> None:
    with PolicyServer(engines.ScriptedEngine(["Score: 1/10"], tokenizer="bytes")) as server:
        with pytest.raises(RuntimeError, match="answered 404"):
            Judge(RUBRIC, base_url=server.base_url, model="no-such-model")("2+2?", "4")
        with pytest.raises(ValueError, match="its own endpoint"):
            Judge(RUBRIC, base_url=server.base_url, model=server.model_name)("2+2?", "4", llm=server.llm())
        port = server.port
    with pytest.raises(RuntimeError, match="cannot be reached"):
        Judge(RUBRIC, base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout=5)("2+2?", "4")
    with pytest.raises(ValueError, match="needs a rubric"):
        Judge(" ")
    with pytest.raises(ValueError, match="needs model"):
        Judge(RUBRIC, base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="fallback must lie in"):
        Judge(RUBRIC, fallback=2.0)


@pytest.mark.slow  # a GRPO step of a tiny model (a few seconds)
def test_a_judge_as_the_reward_of_a_training_step(tiny_engine: Any, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from agentlightning_lite.rl.config import LoggingConfig

    def judge_model(messages: list[dict[str, Any]]) -> str:  # grades by the reply's length
        reply = messages[1]["content"].rpartition("Reply:\n")[2]
        return f"Score: {min(len(reply), 10)}/10"

    trainer = agl.Trainer(
        engine=tiny_engine(lora=agl.LoRA(r=2, alpha=4)),
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        store=agl.MemoryStore(),
        output_dir=tmp_path,
        logging_config=LoggingConfig(loggers=[]),
    )
    self_judge = Judge(RUBRIC, max_tokens=4, fallback=0.0)  # the policy grading itself: side calls
    with PolicyServer(engines.ScriptedEngine(judge_model, tokenizer="bytes")) as judge_server:
        judge = Judge(RUBRIC, base_url=judge_server.base_url, model=judge_server.model_name)

        def agent(task: str, llm: agl.LLM) -> float:
            reply = llm.openai_client(max_retries=0).chat.completions.create(
                model=llm.model, max_tokens=6, messages=[{"role": "user", "content": task}]
            )
            text = reply.choices[0].message.content or ""
            self_judge(task, text, llm=llm)
            return judge(task, text)

        try:
            out = trainer.fit(agent, ["What is 2+2?", "What is 3+3?"], steps=1)
            rollouts = trainer.store.rollouts(mode="train")
            assert len(rollouts) == 4 and out["train/failed_rollouts"] == 0
            for r in rollouts:
                calls = [s for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"]
                assert [c.agent for c in calls] == [None, "side"]
                assert r.reward == min(len(calls[0].output["content"] or ""), 10) / 10
            assert out["train/samples"] == 4  # the policy's calls; the self-judge's four are not trained
            assert judge.usage.calls == 4 and self_judge.usage.calls == 4
        finally:
            trainer.close()
