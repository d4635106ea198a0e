"""A local web view of a store of runs: the rollouts, one rollout's spans, the tokens each call was
trained on with the signal they were trained with, and the training run's metrics (``agl-lite ui``).

Needs ``starlette``, ``uvicorn`` and ``jinja2`` (the ``ui`` extra); the charts are drawn by uPlot,
shipped in ``static/`` (MIT, see ``static/uPlot.LICENSE``), so the page works offline.
"""

from __future__ import annotations

from .data import RolloutQuery, RunData, group_advantages, read_metrics
from .server import UIServer

__all__ = ["RolloutQuery", "RunData", "UIServer", "group_advantages", "read_metrics"]
