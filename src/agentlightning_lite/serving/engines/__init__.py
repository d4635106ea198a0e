"""Policy engines behind the PolicyServer: HF transformers, vLLM (optional) and a scripted one for tests.

>>> from agentlightning_lite.serving import engines
>>> engines.ScriptedEngine(["hi"], tokenizer="bytes").model_name
'scripted'
"""

from .base import BatchingEngine, Engine, GenRequest, GenResult
from .contract import InPlaceEngine, MultiAdapterEngine, ServingEngine, TrainableEngine
from .hf import HFEngine
from .scripted import ScriptedEngine
from .vllm import VLLMEngine

__all__ = [
    "BatchingEngine",
    "Engine",
    "GenRequest",
    "GenResult",
    "HFEngine",
    "InPlaceEngine",
    "MultiAdapterEngine",
    "ScriptedEngine",
    "ServingEngine",
    "TrainableEngine",
    "VLLMEngine",
]
