"""The run doctor: which figure of a run's metrics gives which finding, and the trainer saying them once."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.doctor import ADVICE, Finding, Thresholds, Watch, diagnose
from agentlightning_lite.rl.doctor_report import Report, diagnose_run, format_text, read_metrics, to_json

TRAINER_LOGGER = "agentlightning_lite.rl.trainer"


def healthy(n: int = 8) -> list[dict[str, Any]]:
    """A run that learns: reward up, some spread, few cut replies, tools read, a steady update."""
    return [
        {
            "step": s,
            "train/reward_mean": 0.2 + 0.05 * s,
            "train/rollouts": 16.0,
            "train/failed_rollouts": 0.0,
            "train/timeout_rollouts": 0.0,
            "train/samples": 16.0,
            "samples/truncated": 1.0,
            "grpo/groups": 4.0,
            "grpo/zero_std_frac": 0.25,
            "tools/parsed": 6.0,
            "tools/unparsed": 1.0 if s == 3 else 0.0,
            "diag/entropy": 1.2 - 0.02 * s,
            "diag/distinct_responses": 0.9,
            "mismatch/kl_k3": 2e-4,
            "train/clip_frac": 0.05,
            "train/grad_norm": 0.4 + 0.1 * (s % 3),
            "train/loss": 0.03 * (-1) ** s,
        }
        for s in range(1, n + 1)
    ]


def with_(rows: list[dict[str, Any]], key: str, values: dict[int, float]) -> list[dict[str, Any]]:
    """``rows`` with ``key`` set to ``values[step]`` at those steps."""
    return [{**r, key: values[r["step"]]} if r["step"] in values else r for r in rows]


def codes(rows: list[dict[str, Any]], **thresholds: Any) -> list[str]:
    return [f.code for f in diagnose(rows, thresholds=Thresholds(**thresholds))]


def the(code: str, rows: list[dict[str, Any]]) -> Finding:
    [f] = [f for f in diagnose(rows) if f.code == code]
    return f


def test_a_healthy_run_has_no_finding() -> None:
    assert diagnose(healthy()) == []
    text = format_text(Report("runs/ok", (), rows=8))
    assert "no findings" in text and "warnings:" not in text


def test_zero_spread_needs_half_the_groups_for_three_steps_in_a_row() -> None:
    two = with_(healthy(), "grpo/zero_std_frac", {2: 0.75, 3: 1.0, 5: 0.5, 6: 0.5})  # 2 in a row, twice
    assert "zero_spread" not in codes(two)
    below = with_(healthy(), "grpo/zero_std_frac", dict.fromkeys(range(1, 9), 0.49))
    assert "zero_spread" not in codes(below)
    three = with_(two, "grpo/zero_std_frac", {4: 0.5})
    f = the("zero_spread", three)
    assert f.severity == "warning" and f.steps == (2, 3, 4, 5, 6)
    assert f.figure.startswith("up to 100% of groups without reward spread for 5 steps in a row")
    assert "group_size" in f.advice
    assert "zero_spread" not in codes(three, run=6) and "zero_spread" in codes(three, run=5)


def test_a_constant_reward_is_named_and_a_steady_mean_with_spread_is_not() -> None:
    flat = [{**r, "train/reward_mean": 0.0, "grpo/zero_std_frac": 1.0} for r in healthy()]
    assert {"constant_reward", "zero_spread"} <= set(codes(flat))
    assert the("constant_reward", flat).figure == "train/reward_mean = 0 at all 8 steps"
    steady = [{**r, "train/reward_mean": 0.5} for r in healthy()]  # a quarter of the groups without spread
    assert "constant_reward" not in codes(steady)


def test_replies_cut_at_max_tokens_and_replies_that_never_stop() -> None:
    some = with_(healthy(), "samples/truncated", dict.fromkeys(range(1, 9), 5.0))  # 31%
    f = the("cut_replies", some)
    assert f.figure == "31% of calls cut at max_tokens (40 of 128), steps 1-8"
    assert "SampleConfig(truncated='penalty')" in f.advice and "max_tokens" in f.advice
    few = with_(healthy(), "samples/truncated", dict.fromkeys(range(1, 9), 3.0))  # 19%
    assert "cut_replies" not in codes(few)
    all_cut = with_(healthy(), "samples/truncated", dict.fromkeys(range(1, 9), 16.0))
    assert "never_stop" in codes(all_cut) and "cut_replies" not in codes(all_cut)
    assert "stop string" in the("never_stop", all_cut).advice
    one_step_stops = with_(all_cut, "samples/truncated", {4: 8.0})
    assert "cut_replies" in codes(one_step_stops) and "never_stop" not in codes(one_step_stops)


def test_tool_calls_never_parsed_or_mostly_not() -> None:
    none_read = [
        {**r, "tools/parsed": 0.0, "tools/unparsed": 2.0 if r["step"] > 5 else 0.0} for r in healthy()
    ]
    f = the("tools_unparsed", none_read)
    assert f.steps == (6, 7, 8) and f.figure.startswith(
        "6 replies with a tool-call marker gave no call, 0 calls"
    )
    assert "--tool-call-parser" in f.advice
    mostly = [{**r, "tools/parsed": 1.0, "tools/unparsed": 2.0} for r in healthy()]
    assert "tools_unparsed" in codes(mostly)
    assert "tools_unparsed" not in codes(healthy())  # 1 unparsed beside 48 calls


def test_failed_and_timed_out_rollouts() -> None:
    failing = with_(healthy(), "train/failed_rollouts", {2: 8.0, 3: 8.0})
    f = the("failed_rollouts", failing)
    assert (f.severity, f.steps, f.figure) == ("warning", (2, 3), "16 of 128 rollouts (12%), steps 2-3")
    rare = with_(healthy(), "train/timeout_rollouts", {4: 1.0})
    assert the("timeouts", rare).severity == "info"
    assert [x.severity for x in diagnose(rare)] == ["info"]


def test_entropy_collapse_and_replies_all_alike() -> None:
    falling = with_(healthy(), "diag/entropy", {6: 0.1, 7: 0.05, 8: 0.02})
    f = the("entropy_collapse", falling)
    assert f.steps == (6, 7, 8) and f.figure == "diag/entropy 1.16 (first 3 steps) -> 0.0567 (last 3)"
    slower = with_(healthy(), "diag/entropy", {6: 0.5, 7: 0.5, 8: 0.5})
    assert "entropy_collapse" not in codes(slower)
    alike = with_(healthy(), "diag/distinct_responses", {6: 0.25, 7: 0.25, 8: 0.25})  # groups of 16/4
    assert the("same_replies", alike).figure.startswith("diag/distinct_responses 0.25 = 1/group_size (4)")
    nearly = with_(alike, "diag/distinct_responses", {7: 0.5})
    assert "same_replies" not in codes(nearly)


def test_engine_trainer_mismatch_and_clip_fraction() -> None:
    kl = with_(healthy(), "mismatch/kl_k3", {4: 0.05})
    f = the("logprob_mismatch", kl)
    assert f.steps == (4,) and "mismatch/kl_k3 up to 0.05" in f.figure and "agl.TIS" in f.advice
    clipped = [{**r, "mismatch/clipped_frac": 0.2 if r["step"] == 5 else 0.01} for r in healthy()]
    assert the("logprob_mismatch", clipped).steps == (5,)
    clip = with_(healthy(), "train/clip_frac", {3: 0.4, 4: 0.5, 7: 0.4})
    assert the("clip_frac", clip).steps == (3, 4, 7)
    assert "clip_frac" not in codes(with_(healthy(), "train/clip_frac", {3: 0.4, 4: 0.5}))


def test_a_learning_rate_too_high_shows_as_spikes_and_non_finite_numbers() -> None:
    spike = with_(healthy(), "train/grad_norm", {6: 9.0})
    f = the("lr_too_high", spike)
    assert f.steps == (6,) and "grad norm >= 10x its median so far at steps 6" in f.figure
    assert "agl.GRPO(lr=" in f.advice
    assert "lr_too_high" not in codes(with_(healthy(), "train/grad_norm", {6: 4.0}))
    nan = with_(healthy(), "train/loss", {5: math.nan})
    assert the("lr_too_high", nan).figure == "loss or grad norm not finite at steps 5"
    one_jump = with_(healthy(), "train/loss", {6: 2.0})
    assert "lr_too_high" not in codes(one_jump)
    two_jumps = with_(one_jump, "train/loss", {8: -3.0})
    assert the("lr_too_high", two_jumps).steps == (6, 8)


def test_a_reward_that_went_down_after_the_first_steps() -> None:
    rewards = [0.6, 0.62, 0.58, 0.55, 0.45, 0.4, 0.42, 0.5]
    fell = [{**r, "train/reward_mean": v} for r, v in zip(healthy(), rewards, strict=True)]
    f = the("reward_fell", fell)
    assert f.steps == (6, 7, 8) and f.figure == "mean reward 0.6 over the first 3 steps, 0.44 at steps 6-8"
    a_little = [{**r, "train/reward_mean": v} for r, v in zip(healthy(), [0.6] * 4 + [0.55] * 4, strict=True)]
    assert "reward_fell" not in codes(a_little)
    noisy = [
        {**r, "train/reward_mean": 0.7 if r["step"] % 2 else 0.3} for r in healthy()
    ]  # windows 0.57, 0.43
    assert "reward_fell" not in codes(noisy)  # a drop of 0.13, within the window means' noise
    steady = [{**r, "train/reward_mean": 0.57 if r["step"] <= 3 else 0.43} for r in healthy()]
    assert "reward_fell" in codes(steady)  # the same drop without the noise
    # a dip that recovers is not a fall; a learning run's noisy early steps (2 tasks a step) are not either
    dip = [
        {**r, "train/reward_mean": v}
        for r, v in zip(healthy(), [0.6, 0.6, 0.6, 0.3, 0.3, 0.6, 0.6, 0.6], strict=True)
    ]
    assert "reward_fell" not in codes(dip)
    learning = [0.31, 0.0, 0.31, 0.31, 0.06, 0.0, 0.06, 0.38, 0.19, 0.48, 0.01, 0.19, 0.44, 0.31, 0.56, 0.94]
    rows = [{"step": i + 1, "train/reward_mean": v} for i, v in enumerate(learning)]
    assert all("reward_fell" not in codes(rows[:n]) for n in range(6, 17))


def test_info_is_kept_apart_from_warnings() -> None:
    rows = [{**r, "grpo/zero_std_frac": 1.0} for r in healthy(4)]
    found = diagnose(rows)
    assert [(f.code, f.severity) for f in found] == [("zero_spread", "warning"), ("few_steps", "info")]
    text = format_text(Report("runs/x", tuple(found), rows=4))
    assert text.index("warnings:") < text.index("[zero_spread]") < text.index("for information:")
    assert text.index("for information:") < text.index("[few_steps]")
    assert set(ADVICE) >= {f.code for f in found}


def test_the_trainer_check_says_each_code_once() -> None:
    watch = Watch()
    rows = with_(healthy(), "grpo/zero_std_frac", dict.fromkeys(range(1, 9), 1.0))
    said = [(r["step"], f.code) for r in rows for f in watch.step(r)]
    assert said == [(3, "zero_spread")]
    found, lines = watch.summary()
    assert found and lines[0].startswith("doctor: 1 finding(s) in 8 steps") and "[zero_spread]" in lines[1]
    late = with_(healthy(), "grpo/zero_std_frac", {5: 1.0, 6: 1.0, 7: 1.0, 8: 1.0})  # shows at step 7
    every = Watch()
    assert [(r["step"], f.code) for r in late for f in every.step(r)] == [(7, "zero_spread")]
    sparse = Watch(every_step=2)  # past step 2, a check every n // 2 steps: at 3, 4, 6, 8
    assert [(r["step"], f.code) for r in late for f in sparse.step(r)] == [(8, "zero_spread")]
    quiet = Watch()
    assert [f for r in healthy() for f in quiet.step(r)] == [] and quiet.summary() == (
        False,
        ["doctor: no findings in 8 steps"],
    )


def test_a_run_dir_with_a_cut_last_line_and_failed_rollouts(tmp_path: Path) -> None:
    rows = with_(healthy(), "train/failed_rollouts", {2: 8.0, 5: 8.0})
    text = "\n".join(json.dumps(r) for r in rows) + '\n{"step": 9, "train/rew'
    (tmp_path / "metrics.jsonl").write_text(text)
    with agl.SQLiteStore(tmp_path / "runs.db") as store:
        for error in ["ZeroDivisionError: division by zero"] * 2 + ["KeyError: 'answer'"]:
            ro = store.start_rollout({"q": 1}, mode="train")
            store.finish_rollout(ro.rollout_id, status="failed", error=error)
    report = diagnose_run(tmp_path)
    assert (report.rows, report.bad_lines) == (8, 1)
    assert report.errors == (("ZeroDivisionError: division by zero", 2), ("KeyError: 'answer'", 1))
    out = format_text(report)
    assert "1 line(s) of metrics.jsonl could not be read" in out
    assert "[failed_rollouts]" in out and "error (2x): ZeroDivisionError: division by zero" in out
    data = json.loads(to_json(report))
    assert data["bad_lines"] == 1 and [f["code"] for f in data["findings"]] == ["failed_rollouts"]
    assert data["findings"][0]["steps"] == [2, 5] and data["errors"][0]["count"] == 2
    assert read_metrics(tmp_path / "metrics.jsonl")[0] == rows
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        diagnose_run(tmp_path / "missing")


def _say_hi(task: dict, llm: agl.LLM) -> float:
    """A constant reward, a reward function that raises for one task, and replies cut at 2 tokens."""
    llm.openai_client().chat.completions.create(
        model=llm.model, max_tokens=2, messages=[{"role": "user", "content": f"hi {task['i']}"}]
    )
    return 1.0 / task["i"] * 0.0  # task 0: ZeroDivisionError


@pytest.mark.slow
def test_a_fit_built_to_stay_flat_is_diagnosed_while_it_runs_and_after(
    tiny_engine: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("openai")
    from agentlightning_lite.rl.config import LoggingConfig

    trainer = agl.Trainer(
        engine=tiny_engine(lora=agl.LoRA(r=2, alpha=4), no_eos=True),
        store=agl.SQLiteStore(tmp_path / "runs.db"),
        output_dir=tmp_path,
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        logging_config=LoggingConfig(loggers=[]),
    )
    with trainer, caplog.at_level(logging.INFO, logger=TRAINER_LOGGER):
        trainer.fit(_say_hi, [{"i": i} for i in range(4)], steps=3)
    said = [r.getMessage() for r in caplog.records if r.name == TRAINER_LOGGER]
    each = [m.split("] ")[0].split("[")[1] for m in said if not m.startswith("doctor:")]
    assert sorted(each) == ["constant_reward", "failed_rollouts", "never_stop", "zero_spread"]  # once each
    [summary] = [m for m in said if m.startswith("doctor:")]
    assert summary.startswith("doctor: 4 finding(s) in 3 steps")
    assert [r.levelname for r in caplog.records if r.name == TRAINER_LOGGER] == ["WARNING"] * 5
    report = diagnose_run(tmp_path)
    assert {f.code for f in report.warnings} == {
        "constant_reward",
        "failed_rollouts",
        "never_stop",
        "zero_spread",
    }
    assert the("never_stop", read_metrics(tmp_path / "metrics.jsonl")[0]).figure.startswith(
        "100% of calls cut at max_tokens"
    )
    assert report.errors and "ZeroDivisionError" in report.errors[0][0]
