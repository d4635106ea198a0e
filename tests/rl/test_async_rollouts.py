"""Asynchronous rollouts: the producer rolls out the next step while the learner updates."""

from __future__ import annotations

import concurrent.futures
import math
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import agentlightning_lite as agl
from agentlightning_lite.remote import Runner
from agentlightning_lite.rl.async_rollouts import DrainingHandOver, RequestGate
from agentlightning_lite.rl.config import CheckpointConfig, LoggingConfig, RolloutConfig, SampleConfig
from agentlightning_lite.rl.learner import Learner
from agentlightning_lite.rl.rollouts import RolloutResult, RolloutSpec
from agentlightning_lite.rl.samples import next_tasks
from agentlightning_lite.rl.sources import InProcessRollouts
from agentlightning_lite.rl.weights import WeightHandOver
from agentlightning_lite.serving.engines.base import Engine

from .._helpers import lora_weights

TASKS = [{"q": f"Say something about {i}."} for i in range(8)]


def call(llm: agl.LLM, text: str) -> None:
    llm.openai_client().chat.completions.create(
        model=llm.model, max_tokens=4, messages=[{"role": "user", "content": text}]
    )


def make(engine: Any, tmp_path: Path, k: int | None = 1, handover: str = "finish", **kw: Any) -> agl.Trainer:
    options: dict[str, Any] = dict(
        algorithm=agl.GRPO(group_size=2, lr=1e-3),
        batch_size=2,
        logging_config=LoggingConfig(loggers=[]),
        rollout_config=RolloutConfig(async_rollouts=True, handover=handover),
        sample_config=SampleConfig(max_staleness=k),
    )
    options.update(kw)
    options.setdefault("store", agl.MemoryStore())
    return agl.Trainer(engine=engine, output_dir=tmp_path, **options)


def producers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "agl-rollout-producer" and t.is_alive()]


def timed_learn(
    trainer: agl.Trainer, before: Callable[[int], None] | None = None
) -> list[tuple[float, float]]:
    """Wrap ``trainer.learner.learn``: record each update's ``time.time()`` span (``before(step)`` first)."""
    spans: list[tuple[float, float]] = []
    learn = trainer.learner.learn

    def wrapped(samples: Any, step: int | None = None, timer: Any = None) -> dict[str, float]:
        if before is not None:
            before(int(step or 0))
        t0 = time.time()
        try:
            return learn(samples, step, timer)
        finally:
            spans.append((t0, time.time()))

    trainer.learner.learn = wrapped  # type: ignore[method-assign]
    return spans


def test_async_k1_trains_overlaps_the_update_and_records_versions_call_by_call(
    tiny_engine: Any, tmp_path: Path
) -> None:
    random.seed(0)
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, k=1)
    step_1 = [t["q"] for _, t in next_tasks(TASKS, 4, 0, (0, 0))[0][2:]]  # the tasks of step 1
    first_calls_of_step_1 = threading.Semaphore(0)

    def agent(task: dict, llm: agl.LLM) -> float:
        call(llm, task["q"])
        if task["q"] in step_1:  # a rollout of step 1: its second call waits for the update of step 0
            first_calls_of_step_1.release()
            deadline = time.time() + 10
            while engine.version < 1 and time.time() < deadline:
                time.sleep(0.01)
        call(llm, task["q"] + " Again.")
        return random.random()

    def before(step: int) -> None:
        if step == 0:  # step 1's rollouts have made their first call (on version 0) before update 0
            for _ in range(4):
                assert first_calls_of_step_1.acquire(timeout=10)

    updates = timed_learn(trainer, before)
    weights = lora_weights(trainer.policy)
    out = trainer.fit(agent, TASKS, steps=2)
    assert engine.version == 2 and trainer.step == 2
    after = lora_weights(trainer.policy)
    assert any(not torch.equal(weights[n], after[n]) for n in weights)
    # overlap: step 1's rollouts started before update 0 finished
    step1 = [r for r in trainer.store.rollouts(mode="train") if r.metadata["step"] == 1]
    assert len(step1) == 4 and all(r.start_time < updates[0][1] for r in step1)
    # each call keeps the version that served it: step 1's rollouts span versions 0 and 1
    for r in step1:
        versions = [
            s.attributes["weights_version"] for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"
        ]
        assert versions == [0, 1]
    ts = agl.transitions(trainer.store, rollout_ids=[r.rollout_id for r in step1])
    assert sorted(t.metadata["weights_version"] for t in ts) == [0] * 4 + [1] * 4
    # at step 1 the learner trains on version 1: the first calls are one version old, all kept
    assert out["async/staleness_1"] == 4 and out["async/staleness_0"] == 4
    assert out["async/staleness_mean"] == 0.5 and out["async/dropped_stale"] == 0
    assert out["train/samples"] == 8 and "train/loss" in out
    assert out["time/learner_wait_s"] >= 0 and 0 <= out["async/learner_idle_share"] <= 1
    assert trainer.data_position == (0, 4) and not producers()
    trainer.close()


def test_a_group_with_a_call_older_than_k_is_dropped_whole_and_counted(
    tiny_engine: Any, tmp_path: Path
) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, k=0)
    seen, lock, bumped = Counter(), threading.Lock(), threading.Event()

    def agent(task: dict, llm: agl.LLM) -> float:
        with lock:
            n = seen[task["q"]]
            seen[task["q"]] += 1
        early = task["q"] == "A" and n == 0  # one rollout of group A calls before the weights change
        if not early:
            assert bumped.wait(10)
        call(llm, task["q"])
        if early:
            engine.update_weights(lambda model: None)  # a new version: the early call is now stale
            bumped.set()
        return random.random()

    out = trainer.fit(agent, [{"q": "A"}, {"q": "B"}], steps=1)
    # group A (one stale call, one fresh) is dropped whole; group B is trained
    assert out["async/dropped_stale"] == 2 and out["async/dropped_groups"] == 1
    assert out["train/samples"] == 2 and out["async/staleness_0"] == 2
    assert out["async/staleness_max"] == 0
    trainer.close()


def test_drain_mode_gives_no_request_that_spans_a_switch(tiny_engine: Any, tmp_path: Path) -> None:
    random.seed(2)
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4), step_delay_s=0.005)
    trainer = make(engine, tmp_path, k=1, handover="drain")
    pairs: list[tuple[int, int]] = []

    class Recording(type(engine)):  # type: ignore[misc]
        """Records the version each request reaches the engine at (its start_request: behind the pause)."""

        def start_request(self, request: Any) -> Any:
            at = self.version
            future = super().start_request(request)
            future.add_done_callback(
                lambda f: f.cancelled() or pairs.append((at, f.result().weights_version))
            )
            return future

    engine.__class__ = Recording

    def agent(task: dict, llm: agl.LLM) -> float:
        for i in range(3):
            call(llm, f"{task['q']} {i}")
            time.sleep(0.02)
        return random.random()

    out = trainer.fit(agent, TASKS, steps=3)
    assert engine.version == 3 and out["train/samples"] > 0
    assert len(pairs) == 3 * 4 * 3 and all(a == b for a, b in pairs), pairs
    assert "submit" not in vars(engine) and not producers()  # nothing patched on the engine after fit
    trainer.close()


class FailingSource:
    """The in-process source, failing at its ``fail_at``-th collect."""

    def __init__(self, tracer: agl.Tracer, fail_at: int) -> None:
        self.inner = InProcessRollouts(tracer, RolloutConfig(concurrency=4))
        self.n, self.fail_at = 0, fail_at

    def serve(
        self, engine: Any, store: Any, rollout_timeout: float | None = None, server_options: Any = None
    ) -> Any:
        return self.inner.serve(engine, store, rollout_timeout, server_options)

    def collect(
        self, agent: Any, specs: Sequence[RolloutSpec], progress: Callable[[], None] | None = None
    ) -> list[RolloutResult]:
        self.n += 1
        if self.n == self.fail_at:
            raise ConnectionError("the runners went away")
        return self.inner.collect(agent, specs, progress)

    def stop(self) -> None:
        self.inner.stop()


def varied(task: dict, llm: agl.LLM) -> float:
    call(llm, task["q"])
    return random.random()


def test_async_rollouts_through_remote_runners(tiny_engine: Any, tmp_path: Path) -> None:
    """Two steps' batches in flight at once through one RemoteRunners queue and a runner process's
    workers (in-process here): every rollout comes back to its own step, all of them train."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, runners=agl.RemoteRunners(port=port))
    before = {k: v.clone() for k, v in lora_weights(trainer.policy).items()}
    with Runner(varied, f"http://127.0.0.1:{port}", workers=4):
        out = trainer.fit(varied, TASKS, steps=3)
    store = trainer.store
    ros = store.rollouts(mode="train")
    trainer.close()
    assert not producers()
    assert trainer.step == 3 and out["train/rollouts"] == 4.0
    steps = Counter(r.metadata["step"] for r in ros)
    assert all(steps[s] == 4 for s in range(3)) and all(r.status == "succeeded" for r in ros), steps
    after = lora_weights(trainer.policy)
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_producer_error_surfaces_and_leaves_no_thread(tiny_engine: Any, tmp_path: Path) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    store = agl.MemoryStore()
    trainer = make(engine, tmp_path, store=store, runners=FailingSource(agl.Tracer(store), fail_at=2))
    with pytest.raises(RuntimeError, match="rollout producer failed") as info:
        trainer.fit(varied, TASKS, steps=3)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert trainer.step <= 1 and not producers()
    trainer.close()


def test_failed_steps_and_ctrl_c_stop_the_producer(tiny_engine: Any, tmp_path: Path) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path / "a")

    def broken(task: dict, llm: agl.LLM) -> float:
        raise ImportError("no module named 'tools'")

    with pytest.raises(RuntimeError, match="every rollout of step 1 failed"):
        trainer.fit(broken, TASKS, steps=3)
    assert trainer.step == 1 and not producers()
    trainer.close()

    trainer = make(engine, tmp_path / "b")

    def interrupt(step: int) -> None:
        if step == 1:
            raise KeyboardInterrupt

    timed_learn(trainer, interrupt)
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(varied, TASKS, steps=4)
    assert trainer.step == 1 and not producers()
    trainer.close()


def test_the_learner_hands_weights_over_through_a_context_that_restores_them() -> None:
    model = torch.nn.Linear(2, 2)
    engine = agl.engines.ScriptedEngine(["hi"], tokenizer="bytes")
    learner = Learner(model, [], WeightHandOver(engine, model), agl.GRPO())
    own, first, second = learner.weights, WeightHandOver(engine, model), WeightHandOver(engine, model)
    with pytest.raises(ValueError, match="update failed"), learner.using_weights(first) as used:
        assert used is first and learner.weights is first
        with learner.using_weights(second):
            assert learner.weights is second
        assert learner.weights is first  # nested: each block gives back what it found
        raise ValueError("update failed")
    assert learner.weights is own


def test_drain_mode_gives_the_learner_its_hand_over_back_after_an_error(
    tiny_engine: Any, tmp_path: Path
) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    trainer = make(engine, tmp_path, handover="drain")
    own, seen = trainer.learner.weights, []

    def broken(task: dict, llm: agl.LLM) -> float:
        seen.append(trainer.learner.weights)
        raise ImportError("no module named 'tools'")

    with pytest.raises(RuntimeError, match="every rollout of step 1 failed"):
        trainer.fit(broken, TASKS, steps=3)
    assert seen and all(isinstance(w, DrainingHandOver) for w in seen)  # the engine drains while fitting
    assert trainer.learner.weights is own and not producers()
    trainer.close()


def test_async_training_resumes_from_its_checkpoint(tiny_engine: Any, tmp_path: Path) -> None:
    random.seed(3)
    save = CheckpointConfig(save_every=1)
    trainer = make(tiny_engine(lora=agl.LoRA(r=2, alpha=4)), tmp_path, k=2, checkpoint_config=save)
    out = trainer.fit(varied, TASKS, steps=2, val_dataset=TASKS[:2])
    assert "val/reward_mean" in out and out["engine/version"] == 2.0
    assert trainer.data_position == (0, 4)  # the position of the steps trained, not of those rolled out
    trainer.close()
    again = make(tiny_engine(lora=agl.LoRA(r=2, alpha=4)), tmp_path, k=2, checkpoint_config=save)
    out = again.fit(varied, TASKS, steps=3, resume=True)
    assert again.step == 3 and again.data_position == (0, 6) and out["train/rollouts"] == 4
    steps = [r.metadata["step"] for r in again.store.rollouts(mode="train")]
    assert steps == [2, 2, 2, 2] and not producers()
    again.close()


def test_handover_is_checked() -> None:
    with pytest.raises(ValueError, match="handover must be"):
        RolloutConfig(handover="pause")


class SlowEngine(Engine):
    """An engine whose requests finish when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[concurrent.futures.Future[Any]] = []

    def start_request(self, request: Any) -> concurrent.futures.Future[Any]:
        f: concurrent.futures.Future[Any] = concurrent.futures.Future()
        f.set_running_or_notify_cancel()
        self.pending.append(f)
        return f

    def cancel_request(self, future: concurrent.futures.Future[Any]) -> bool:
        return False

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        return [self.submit(r).result() for r in requests]


def test_the_gate_waits_for_requests_in_flight_and_holds_new_ones() -> None:
    engine = SlowEngine()
    gate = RequestGate(engine)  # it pauses the engine through the engine's own pause()
    first = engine.submit("a")  # in flight on version 0
    switched = threading.Event()

    def switch() -> None:
        with gate.closed():
            engine.version = 1
            switched.set()

    t = threading.Thread(target=switch)
    t.start()
    time.sleep(0.1)
    assert not switched.is_set()  # the switch waits for the request in flight
    held = engine.submit("b")  # arrives meanwhile: held, not yet at the engine
    dropped = engine.submit("c")
    assert len(engine.pending) == 1 and engine.cancel(dropped) and dropped.cancelled()
    engine.pending[0].set_result("a done")
    t.join(5)
    assert switched.is_set() and first.result() == "a done"
    assert len(engine.pending) == 2  # the held request went on after the switch, the cancelled one not
    engine.pending[1].set_result("b done")
    assert held.result(1) == "b done" and len(gate.switches) == 1
    assert "submit" not in vars(engine) and "cancel" not in vars(engine)


@pytest.mark.parametrize("handover", ["finish", "drain"])
@pytest.mark.slow  # more than 3 s (docs/testing.md)
def test_async_rollouts_on_the_vllm_engine_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handover: str
) -> None:
    """engine="vllm" (a stand-in ``vllm`` process serving the model over HTTP with the HF engine):
    rollouts run ahead of the update, each update reaches the server as a new adapter version while
    the next step's rollouts call it, every call records the version that served it, and the trained
    adapter is the one served at the end."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from .._helpers import standin_vllm_trainer

    random.seed(4)
    trainer = standin_vllm_trainer(
        tmp_path,
        monkeypatch,
        rollout_config=RolloutConfig(async_rollouts=True, handover=handover),
        sample_config=SampleConfig(max_staleness=1),
    )
    try:

        def agent(task: dict, llm: agl.LLM) -> float:
            call(llm, task["q"])
            time.sleep(0.2)  # a tool: the update runs meanwhile
            call(llm, task["q"] + " Again.")
            return random.random()

        updates = timed_learn(trainer)
        out = trainer.fit(agent, TASKS, steps=3)
        engine = trainer.engine
        assert trainer.step == 3 and engine.version == 3
        assert engine.adapter_version("policy") == "policy-v3"
        served = load_file(Path(engine._paths["policy-v3"]) / "adapter_model.safetensors")
        trained = get_peft_model_state_dict(trainer.policy)
        assert all(torch.equal(served[k], trained[k].cpu()) for k in trained)
        ros = trainer.store.rollouts(mode="train")
        assert len(ros) == 12 and all(r.status == "succeeded" for r in ros)
        # the overlap: step 1's rollouts started before update 0 ended
        assert any(r.start_time < updates[0][1] for r in ros if r.metadata["step"] == 1)
        for r in ros:  # every call names the version that served it: at most one behind its step
            versions = [
                s.attributes["weights_version"] for s in trainer.store.spans(r.rollout_id) if s.kind == "llm"
            ]
            assert len(versions) == 2 and all(
                r.metadata["step"] - 1 <= v <= r.metadata["step"] for v in versions
            )
        assert out["async/staleness_max"] <= 1 and out["async/dropped_stale"] == 0
        assert out["train/samples"] == 8 and math.isfinite(out["train/loss"])
        assert not producers()
    finally:
        trainer.close()


@pytest.mark.parametrize("ahead", [True, False])
def test_ctrl_c_cancels_the_rollouts_in_flight_and_returns_at_once(
    tiny_engine: Any, tmp_path: Path, ahead: bool
) -> None:
    """Ctrl-C while the agents block on a long call (the rollout timeout is 300 s): ``fit`` returns
    within seconds and every rollout in flight is recorded ``failed`` (cancelled) in the store."""
    import _thread

    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    config = RolloutConfig(async_rollouts=ahead, timeout=300.0)
    trainer = make(engine, tmp_path, rollout_config=config)
    called, release, pressed = threading.Semaphore(0), threading.Event(), []

    def blocking(task: dict, llm: agl.LLM) -> float:
        call(llm, task["q"])
        called.release()
        release.wait(60)  # a tool that takes a minute
        return 1.0

    def ctrl_c() -> None:
        for _ in range(4):  # step 0's rollouts have all made their call
            called.acquire(timeout=30)
        pressed.append(time.monotonic())
        _thread.interrupt_main()

    threading.Thread(target=ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.fit(blocking, TASKS, steps=3)
        took = time.monotonic() - pressed[0]
        ros = trainer.store.rollouts(mode="train")
        assert took < 10, took  # the agents would block for 60 s, the timeout is 300 s
        assert len(ros) == (8 if ahead else 4)  # k=1: steps 0 and 1 ran at once
        assert all(r.status == "failed" and "Cancelled" in (r.error or "") for r in ros), ros
        assert trainer.step == 0 and not producers()
    finally:
        release.set()
        trainer.close()
