"""Seconds per phase of a training step (``timing/rollouts``, ``timing/update``...), the way verl
reports ``timing_s/...``."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch

__all__ = ["Timer"]


class Timer:
    """Seconds per phase, summed over a step: ``{"timing/<phase>": s}``.

    >>> t = Timer()
    >>> with t.phase("update"):
    ...     pass
    >>> list(t.metrics())
    ['timing/update']
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)  # the GPU's work belongs to the phase that queued it
            self.add(name, time.perf_counter() - t0)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        return {f"timing/{k}": v for k, v in self.seconds.items()}
