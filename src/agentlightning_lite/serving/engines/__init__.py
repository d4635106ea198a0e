"""Policy engines behind the PolicyServer: HF transformers, inference servers over HTTP (vLLM started or
attached), and a scripted one for tests.

>>> from agentlightning_lite.serving import engines
>>> engines.ScriptedEngine(["hi"], tokenizer="bytes").model_name
'scripted'
"""

from ..._compat import quiet_upstream_warnings
from .base import Engine, GenRequest, GenResult
from .batching import BatchingEngine, RunningRequest, describe_running
from .contract import (
    AdapterRemovingEngine,
    BackendError,
    InPlaceEngine,
    MultiAdapterEngine,
    ServingEngine,
    TrainableEngine,
)
from .hf import HFEngine
from .http import HTTPEngine
from .scripted import ScriptedEngine
from .vllm import VLLMEngine

quiet_upstream_warnings()  # for the HF engine's peft models

__all__ = [
    "AdapterRemovingEngine",
    "BackendError",
    "BatchingEngine",
    "Engine",
    "GenRequest",
    "GenResult",
    "HFEngine",
    "HTTPEngine",
    "InPlaceEngine",
    "MultiAdapterEngine",
    "RunningRequest",
    "ScriptedEngine",
    "ServingEngine",
    "TrainableEngine",
    "VLLMEngine",
    "describe_running",
]
