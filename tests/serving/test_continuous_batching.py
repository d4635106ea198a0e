"""HFEngine's continuous batching on a tiny model: rows leave the batch as they end and join it between
steps with the results they get alone; a prompt shared by several requests is prefilled once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agentlightning_lite.serving.engines import GenRequest, GenResult, describe_running

pytest.importorskip("torch")
pytest.importorskip("transformers")


def wait_for(cond: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.005)


def same(a: GenResult, b: GenResult) -> None:
    """The same reply: tokens, finish reason, and logprobs up to float noise (batch shapes differ)."""
    assert (a.token_ids, a.finish_reason, a.stop_reason) == (b.token_ids, b.finish_reason, b.stop_reason)
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def prompt(engine: Any, text: str) -> list[int]:
    return list(engine.tokenizer.encode(text))


def batch_rows(engine: Any) -> list[int]:
    """Record the rows of every forward pass of ``engine``'s model (prefills and decoding steps)."""
    seen: list[int] = []

    def hook(module: Any, args: Any, kwargs: Any) -> None:
        seen.append(int(kwargs["input_ids"].shape[0]))

    engine.model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def test_batched_greedy_and_seeded_rows_match_each_request_alone(tiny_engine: Any) -> None:
    engine = tiny_engine(max_batch_size=8)
    reqs = [
        GenRequest(prompt(engine, "Hello there"), max_tokens=12, temperature=0.0),
        GenRequest(prompt(engine, "A much longer prompt than the others"), max_tokens=30, temperature=0.0),
        GenRequest(prompt(engine, "seeded"), max_tokens=20, temperature=0.8, seed=7),
        GenRequest(prompt(engine, "truncated"), max_tokens=9, temperature=1.0, seed=3, top_p=0.9, top_k=50),
        GenRequest(prompt(engine, "penalised"), max_tokens=15, temperature=1.0, seed=1, presence_penalty=0.5),
        GenRequest(prompt(engine, "tops"), max_tokens=6, temperature=0.0, top_logprobs=3),
        GenRequest(prompt(engine, "x"), max_tokens=25, temperature=0.0, stop=["e"]),
    ]
    alone = [engine.generate([r])[0] for r in reqs]
    engine.reset_stats()
    engine.expect(len(reqs))
    together = engine.generate(reqs)
    for a, b in zip(alone, together, strict=True):
        same(a, b)
    assert together[5].top_logprobs is not None and len(together[5].top_logprobs) == 6
    stats = engine.stats
    assert stats["batches"] == 1 and stats["max_batch_size"] == len(reqs), stats
    assert stats["prefill_passes"] == 1  # the first batch's prompts prefilled together
    assert stats["generated_tokens"] == sum(r.num_tokens for r in together)


def test_a_request_joining_mid_batch_gets_what_it_gets_alone(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=4)
    long = GenRequest(prompt(engine, "the long one"), max_tokens=80, temperature=0.0)
    late = [
        GenRequest(prompt(engine, "late and greedy"), max_tokens=10, temperature=0.0),
        GenRequest(prompt(engine, "late, seeded"), max_tokens=10, temperature=1.0, seed=5),
    ]
    alone = [engine.generate([r])[0] for r in (long, *late)]
    engine.reset_stats()
    first = engine.submit(long)
    wait_for(lambda: bool(engine.running()) and engine.running()[0].tokens >= 10)
    joined = [engine.submit(r) for r in late]
    results = [f.result(60) for f in joined]
    assert not first.done()  # they joined the running batch and ended before it
    for a, b in zip(alone, [first.result(60), *results], strict=True):
        same(a, b)
    stats = engine.stats
    assert stats["batches"] == 1 and stats["max_batch_size"] == 3, stats


def test_a_short_reply_returns_before_a_long_one_of_its_batch(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.002, no_eos=True, max_batch_size=8)
    order: list[str] = []
    reqs = {
        "long": GenRequest(prompt(engine, "long"), max_tokens=120, temperature=0.0),
        "short": GenRequest(prompt(engine, "short"), max_tokens=3, temperature=0.0),
        "medium": GenRequest(prompt(engine, "medium"), max_tokens=30, temperature=0.0),
    }
    engine.expect(len(reqs))
    futures = {}
    for name, r in reqs.items():
        futures[name] = engine.submit(r)
        futures[name].add_done_callback(lambda _f, name=name: order.append(name))
    results = {name: f.result(60) for name, f in futures.items()}
    assert order == ["short", "medium", "long"]
    assert [results[n].num_tokens for n in ("short", "medium", "long")] == [3, 30, 120]
    assert engine.stats["batches"] == 1  # one batch: the short reply did not wait for it to end


def test_cancelling_a_row_frees_its_slot_and_leaves_the_others_untouched(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=2)
    a = GenRequest(prompt(engine, "to be cancelled"), max_tokens=400, temperature=0.0)
    b = GenRequest(prompt(engine, "kept"), max_tokens=60, temperature=1.0, seed=11)
    c = GenRequest(prompt(engine, "waiting"), max_tokens=8, temperature=0.0)
    alone_b, alone_c = engine.generate([b])[0], engine.generate([c])[0]
    rows = batch_rows(engine)
    order: list[str] = []
    engine.expect(2)
    futures = {"a": engine.submit(a), "b": engine.submit(b)}
    wait_for(lambda: len(engine.running()) == 2)
    futures["c"] = engine.submit(c)  # no slot: it waits
    for name, f in futures.items():
        f.add_done_callback(lambda _f, name=name: order.append(name))
    time.sleep(0.05)
    assert not futures["c"].done() and len(engine.running()) == 2
    assert engine.cancel(futures["a"])
    res = {name: f.result(60) for name, f in futures.items()}
    assert res["a"].finish_reason == "abort" and res["a"].num_tokens < 400
    assert order == ["a", "c", "b"]  # c took a's slot and ended while b was still decoding
    same(res["b"], alone_b)
    same(res["c"], alone_c)
    assert max(rows) == 2
    assert engine.stats["aborted"] == 1


def test_the_engine_never_holds_more_rows_than_max_batch_size(tiny_engine: Any) -> None:
    engine = tiny_engine(max_batch_size=3)
    reqs = [
        GenRequest(prompt(engine, f"prompt {i}"), max_tokens=4 + 3 * i, temperature=0.0) for i in range(10)
    ]
    alone = [engine.generate([r])[0] for r in reqs]
    rows = batch_rows(engine)
    engine.reset_stats()
    engine.expect(10)
    together = [f.result(60) for f in [engine.submit(r) for r in reqs]]
    for a, b in zip(alone, together, strict=True):
        same(a, b)
    assert max(rows) == 3 and engine.stats["max_batch_size"] == 3, rows
    assert engine.stats["requests"] == 10


def test_a_prompt_shared_by_a_group_is_prefilled_once(tiny_engine: Any) -> None:
    engine = tiny_engine(max_batch_size=8)
    shared = prompt(engine, "Solve: what is 12 * 7? Think step by step.")
    group = [GenRequest(shared, max_tokens=16, temperature=1.0, seed=s) for s in range(6)]
    other = GenRequest(prompt(engine, "another task"), max_tokens=16, temperature=1.0, seed=99)
    alone = [engine.generate([r])[0] for r in (*group, other)]
    engine.reset_stats()
    engine.expect(len(group) + 1)
    together = engine.generate([*group, other])
    for a, b in zip(alone, together, strict=True):
        same(a, b)
    assert len({tuple(r.token_ids) for r in together[:-1]}) > 1  # the seeds differ
    stats = engine.stats
    assert stats["prefill_tokens"] == len(shared) + len(other.prompt_token_ids), stats
    assert (stats["prefix_cache_hits"], stats["prefill_tokens_saved"]) == (5, 5 * len(shared))


def test_a_group_arriving_one_by_one_reuses_the_prefilled_prompt(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=8)
    shared = prompt(engine, "The same task for every rollout of the group")
    group = [GenRequest(shared, max_tokens=12, temperature=1.0, seed=s) for s in range(4)]
    long = GenRequest(prompt(engine, "keeps the engine busy"), max_tokens=200, temperature=0.0)
    alone = [engine.generate([r])[0] for r in group]
    engine.reset_stats()
    busy = engine.submit(long)
    wait_for(lambda: bool(engine.running()))
    results = []
    for r in group:  # each joins on its own, after the one before ended
        results.append(engine.submit(r).result(60))
    for a, b in zip(alone, results, strict=True):
        same(a, b)
    assert not busy.done()
    stats = engine.stats
    assert stats["prefill_tokens"] == len(shared) + len(long.prompt_token_ids), stats
    assert stats["prefix_cache_hits"] == 3
    engine.cancel(busy)
    assert busy.result(60).finish_reason == "abort"


def test_running_reports_the_replies_in_progress(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=4)
    assert engine.running() == []
    req = GenRequest(prompt(engine, "hi"), max_tokens=500, request_id="r1", session="ro-1")
    fut = engine.submit(req)
    wait_for(lambda: bool(engine.running()) and engine.running()[0].tokens >= 5)
    (now,) = engine.running()
    n_prompt = len(req.prompt_token_ids)
    assert (now.request_id, now.session, now.prompt_tokens, now.adapter) == ("r1", "ro-1", n_prompt, None)
    assert 5 <= now.tokens < 500 and now.seconds > 0
    assert describe_running([now]).startswith("1 reply still generating: r1 (rollout ro-1): ")
    engine.cancel(fut)
    assert fut.result(60).finish_reason == "abort"
    wait_for(lambda: engine.running() == [])
    stats = engine.stats
    assert stats["decode_tokens"] == stats["decode_steps"] >= now.tokens - 1
    assert stats["prefill_tokens"] == n_prompt and stats["prefill_passes"] == 1


def test_a_weight_update_waits_for_the_running_rows_and_holds_new_ones(tiny_engine: Any) -> None:
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=4)
    first = engine.submit(GenRequest(prompt(engine, "old weights"), max_tokens=60, temperature=0.0))
    wait_for(lambda: bool(engine.running()))
    updated = threading.Event()
    threading.Thread(
        target=lambda: (engine.update_weights(lambda m: None), updated.set()), daemon=True
    ).start()
    wait_for(lambda: engine._updates_waiting == 1)
    later = engine.submit(GenRequest(prompt(engine, "new weights"), max_tokens=3, temperature=0.0))
    r_first, r_later = first.result(60), later.result(60)
    assert updated.wait(10)
    assert (r_first.weights_version, r_first.num_tokens) == (0, 60)  # not cut short by the update
    assert r_later.weights_version == 1  # it did not join the rows of the old weights


def test_prompts_sharing_a_head_prefill_it_once_and_later_prompts_reuse_it(tiny_engine: Any) -> None:
    """Few-shot prompts (one long head, different questions) get what they get alone; the head runs once,
    and a prompt joining the running batch later with the same head prefills only its own tail."""
    engine = tiny_engine(step_delay_s=0.005, no_eos=True, max_batch_size=8)
    head = prompt(engine, "Examples: 1 + 1 = <answer>2</answer>; 3 - 1 = <answer>2</answer>. Now: ")
    assert len(head) >= 40
    tails = [prompt(engine, q) for q in ("4 + 5 =", "9 - 2 = ?", "7 + 0")]
    reqs = [GenRequest(head + t, max_tokens=10, temperature=0.0) for t in tails]
    reqs.append(GenRequest(head + tails[0], max_tokens=10, temperature=1.0, seed=3))  # a duplicate prompt
    later = [
        GenRequest(head + prompt(engine, "2 + 2 equals"), max_tokens=10, temperature=0.0),
        GenRequest(head + prompt(engine, "8 - 8 equals"), max_tokens=10, temperature=1.0, seed=4),
    ]
    alone = [engine.generate([r])[0] for r in (*reqs, *later)]
    engine.reset_stats()
    engine.expect(len(reqs))
    together = engine.generate(reqs)
    for a, b in zip(alone[: len(reqs)], together, strict=True):
        same(a, b)
    assert engine.stats["prefill_tokens"] == len(head) + sum(len(t) for t in tails), engine.stats
    assert engine.stats["prefill_tokens_saved"] == 3 * len(head) + len(reqs[-1].prompt_token_ids)

    first = GenRequest(head + prompt(engine, "keep going"), max_tokens=300, temperature=0.0)
    busy = engine.submit(first)
    wait_for(lambda: bool(engine.running()))
    engine.reset_stats()
    for a, r in zip(alone[len(reqs) :], later, strict=True):  # each joins the running batch on its own
        same(a, engine.submit(r).result(60))
        assert not busy.done()
    tails_later = sum(len(r.prompt_token_ids) - len(head) for r in later)
    # the running batch's first prompt was prefilled whole; the later ones reuse its head's KV
    assert engine.stats["prefill_tokens"] == len(first.prompt_token_ids) + tails_later, engine.stats
    engine.cancel(busy)
