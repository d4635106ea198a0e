"""A Tinker-compatible training API served by this project: the official ``tinker`` SDK (0.38) trains
LoRA adapters here, on the project's transformers engine, and samples from them.

``agl-lite tinker --model smollm2-135m --port 8000`` serves it; or, in Python:

>>> import agentlightning_lite.tinker as tk
>>> sorted(tk.LOSSES)
['cispo', 'cross_entropy', 'importance_sampling', 'ppo']
>>> with tk.TinkerServer(tk.build_backend("smollm2-135m"), "runs/tinker") as server:  # doctest: +SKIP
...     print(server.url)  # TINKER_BASE_URL for the SDK (with TINKER_API_KEY=tml-anything)
http://127.0.0.1:...

What is served and what is refused: ``docs/tinker.md``.
"""

from .backend import AdamParams, Datum, ForwardBackwardResult, ModelInfo, SampledSequence, TrainingBackend
from .futures import OpError
from .losses import LOSSES
from .server import TinkerServer, build_backend

__all__ = [
    "LOSSES",
    "AdamParams",
    "Datum",
    "ForwardBackwardResult",
    "ModelInfo",
    "OpError",
    "SampledSequence",
    "TinkerServer",
    "TrainingBackend",
    "build_backend",
]
