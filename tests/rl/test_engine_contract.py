"""The engine contract: which engines satisfy which protocol, and the trainer relying on it
(it checks protocols, never probes attributes, and never writes an engine's version)."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any

import pytest

import agentlightning_lite as agl
from agentlightning_lite.rl.config import LoggingConfig
from agentlightning_lite.serving import engines
from agentlightning_lite.serving.engines import (
    AdapterRemovingEngine,
    InPlaceEngine,
    MultiAdapterEngine,
    ServingEngine,
    TrainableEngine,
)
from agentlightning_lite.serving.engines.pausing import Pausable, PauseGate


def test_scripted_engine_serves_only() -> None:
    engine = engines.ScriptedEngine(["hi"], tokenizer="bytes")
    assert isinstance(engine, ServingEngine)
    assert not isinstance(engine, TrainableEngine)
    assert not isinstance(engine, MultiAdapterEngine)
    assert not isinstance(engine, AdapterRemovingEngine)
    assert not hasattr(engine, "update_weights")  # no method that only raises: the contract is honest


def test_backend_error_is_part_of_the_contract_and_importable_where_it_was() -> None:
    """``BackendError`` lives with the engine contract; the HTTP engine's modules re-export the same class."""
    from agentlightning_lite.serving.engines import contract, http, http_backend

    assert engines.BackendError is contract.BackendError is http.BackendError is http_backend.BackendError
    err = contract.BackendError("server down", status=None, path="/v1/completions", reason=None)
    assert isinstance(err, RuntimeError) and err.path == "/v1/completions" and str(err) == "server down"


def test_hf_engine_trains_in_place_and_serves_several_adapters(tiny_engine: Any) -> None:
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    assert isinstance(engine, InPlaceEngine) and isinstance(engine, TrainableEngine)
    assert isinstance(engine, MultiAdapterEngine)
    assert isinstance(engine, AdapterRemovingEngine)  # the PolicyServer's unload route relies on it
    engine.add_adapter("extra", agl.LoRA(r=2, alpha=4))
    engine.remove_adapter("extra")
    assert "extra" not in engine.adapters
    assert engine.update_weights(lambda model: None) == 1  # the engine counts its own updates
    assert engine.version == 1


def test_vllm_engine_takes_weights_but_does_not_train_in_place(tiny_engine: Any) -> None:
    from agentlightning_lite.serving import PolicyServer

    with PolicyServer(tiny_engine()) as server:  # speaks the vLLM HTTP subset VLLMEngine drives
        engine = engines.VLLMEngine("tiny", url=server.url, tokenizer="bytes", check_version=False)
        try:
            assert isinstance(engine, TrainableEngine)
            assert not isinstance(engine, InPlaceEngine)  # weights live in vLLM: the trainer pushes copies
            assert isinstance(engine, MultiAdapterEngine)  # saved adapters, loaded over HTTP
            # and taken out again: the server unloads it once its requests are done
            assert isinstance(engine, AdapterRemovingEngine)
        finally:
            engine.close()


def test_trainer_refuses_policies_on_an_engine_without_add_adapter(fake_vllm: Any, tmp_path: Path) -> None:
    engine = engines.ScriptedEngine(["hi"], tokenizer="bytes")
    with pytest.raises(TypeError, match="serves several adapters"):
        agl.Trainer(
            engine=engine,
            policies={"a": agl.LoRA(r=2)},
            store=agl.MemoryStore(),
            output_dir=tmp_path,
            logging_config=LoggingConfig(loggers=[]),
        )


def test_resume_loads_the_checkpoint_through_the_engine(tiny_engine: Any, tmp_path: Path) -> None:
    """An in-place engine gets the checkpoint through ``update_weights(fn)``: under its lock, and the
    engine (not the trainer) bumps its version."""
    engine = tiny_engine(lora=agl.LoRA(r=2, alpha=4))
    first = agl.Trainer(
        engine=engine, store=agl.MemoryStore(), output_dir=tmp_path, logging_config=LoggingConfig(loggers=[])
    )
    first.save_checkpoint()
    first.close()
    calls: list[bool] = []
    update = engine.update_weights

    def spy(source: Any, adapter: str | None = None) -> int:
        calls.append(callable(source))  # a function run on the engine's model, under its lock
        return update(source, adapter)

    engine.update_weights = spy
    second = agl.Trainer(
        engine=engine, store=agl.MemoryStore(), output_dir=tmp_path, logging_config=LoggingConfig(loggers=[])
    )
    second.fit(lambda task, llm: 1.0, [{"q": 0}], steps=0, resume=True)
    assert calls == [True]
    assert engine.version == 1
    second.close()


class _Gated(engines.ScriptedEngine):
    """A subclass with its own start_request (calling its parent's): behind the pause, reached once."""

    def __init__(self) -> None:
        super().__init__(["ok"], tokenizer="bytes")
        self.reached: list[int] = []

    def start_request(self, request: Any) -> Any:
        self.reached.append(self.version)
        return super().start_request(request)


def test_every_engine_pauses_through_its_contract() -> None:
    """``pause()`` holds new requests until ``resume()`` and waits for the ones in flight; a held
    request can be cancelled; every engine class has it from the base class (no instance patching):
    ``submit``/``cancel`` are the base class's, through the pause gate, and the engines implement
    ``start_request``/``cancel_request``."""
    for cls in (engines.ScriptedEngine, engines.HFEngine, engines.HTTPEngine, engines.VLLMEngine):
        assert all(callable(getattr(cls, n, None)) for n in ("pause", "resume", "paused"))
        assert cls.submit is engines.Engine.submit and cls.cancel is engines.Engine.cancel
    assert engines.HFEngine.start_request is not engines.Engine.start_request  # its own, behind the gate
    engine = _Gated()
    assert isinstance(engine, ServingEngine) and isinstance(engine, Pausable)
    req = engines.GenRequest(prompt_token_ids=[1])
    with engine.paused():
        held, dropped = engine.submit(req), engine.submit(req)
        assert engine.reached == [] and not held.done()  # held above the subclass's own submit
        assert engine.cancel(dropped) and dropped.cancelled()
        engine.version = 1  # the weights switch while paused
    assert held.result(5).text == "ok" and engine.reached == [1]  # reached the engine once, after
    assert "submit" not in vars(engine) and "cancel" not in vars(engine)
    with pytest.raises(RuntimeError, match="resume"):
        engine.resume()


def test_a_pause_waits_for_the_requests_in_flight() -> None:
    import threading
    import time

    gate = threading.Event()

    class Slow(engines.ScriptedEngine):
        def generate(self, requests: Any) -> Any:
            gate.wait(5)
            return super().generate(requests)

    engine = Slow(["ok"], tokenizer="bytes")
    first = engine.submit(engines.GenRequest(prompt_token_ids=[1]))
    paused_at: list[float] = []
    t = threading.Thread(target=lambda: (engine.pause(), paused_at.append(time.monotonic())))
    t.start()
    time.sleep(0.2)
    assert paused_at == []  # the request in flight keeps the pause from starting
    released = time.monotonic()
    gate.set()
    t.join(5)
    assert first.result(5).text == "ok" and paused_at and paused_at[0] >= released
    engine.resume()
    engine.close()


def _started(log: list[Any]) -> Any:
    """A start function that records each request and leaves its future pending (the test settles it)."""
    import concurrent.futures

    def start(request: Any) -> Any:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        future.set_running_or_notify_cancel()
        log.append((request, future))
        return future

    return start


def test_the_pause_gate_holds_nests_and_resumes_on_an_error() -> None:
    """The gate alone: nested pauses resume at the last, a held request's start error reaches its
    caller's future, ``paused()`` resumes on an error, a resume without a pause is refused."""
    log: list[Any] = []
    gate = PauseGate()
    gate.pause()
    gate.pause()
    held = gate.submit("a", _started(log))

    def broken(request: Any) -> Any:
        raise ValueError(f"cannot start {request}")

    failing = gate.submit("b", broken)
    gate.resume()
    assert log == [] and not held.done()  # one pause still open
    gate.resume()
    assert [r for r, _ in log] == ["a"] and gate.in_flight == 1
    with pytest.raises(ValueError, match="cannot start b"):
        failing.result(1)
    log[0][1].set_result("A")
    assert held.result(1) == "A" and gate.in_flight == 0
    with pytest.raises(RuntimeError, match="boom"), gate.paused():
        raise RuntimeError("boom")
    assert gate.pauses == 0
    with pytest.raises(RuntimeError, match=r"resume\(\) without pause\(\)"):
        gate.resume()


def test_a_request_passed_on_after_a_pause_is_cancelled_where_it_runs() -> None:
    log: list[Any] = []
    cancelled: list[Any] = []
    gate = PauseGate()
    with gate.paused():
        outer = gate.submit("a", _started(log))
    ((_, inner),) = log
    assert outer is not inner and not outer.done()

    def cancel(future: Any) -> bool:
        cancelled.append(future)
        future.set_exception(concurrent.futures.CancelledError())  # a running request stopped
        return True

    assert gate.cancel(outer, cancel) and cancelled == [inner]  # the engine is asked about the running one
    with pytest.raises(concurrent.futures.CancelledError):
        outer.result(1)
    assert gate.in_flight == 0
