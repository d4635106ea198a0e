"""The engine contract: which engines satisfy which protocol, and the trainer relying on it
(it checks protocols, never probes attributes, and never writes an engine's version)."""

from __future__ import annotations

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


def test_scripted_engine_serves_only() -> None:
    engine = engines.ScriptedEngine(["hi"], tokenizer="bytes")
    assert isinstance(engine, ServingEngine)
    assert not isinstance(engine, TrainableEngine)
    assert not isinstance(engine, MultiAdapterEngine)
    assert not isinstance(engine, AdapterRemovingEngine)
    assert not hasattr(engine, "update_weights")  # no method that only raises: the contract is honest


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
            assert not isinstance(engine, AdapterRemovingEngine)  # vLLM's adapters are not taken out
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
