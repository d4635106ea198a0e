"""Which precision a CPU computes fastest in: bfloat16 autocast where the processor has bfloat16 units
(AMX or AVX512-BF16), float32 elsewhere, chosen once and logged."""

from __future__ import annotations

import logging
import sys
from functools import cache
from typing import Any

__all__ = ["BF16_FLAGS", "bf16_units", "cpu_autocast"]

logger = logging.getLogger(__name__)

#: the CPU flags (Linux ``/proc/cpuinfo``) of units that multiply bfloat16 matrices natively
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def bf16_units(cpuinfo: str | None = None) -> list[str]:
    """The bfloat16 units this CPU advertises (of :data:`BF16_FLAGS`; empty off Linux or without them).

    Without them, torch computes bfloat16 matrix products by conversion, far slower than float32
    (measured on an AVX2-only AMD EPYC, 2 threads, a 512x576 @ 576x1536 product: 47 GFLOP/s in
    float32, 1.1 in bfloat16); with AMX they run about 3x float32's.

    >>> bf16_units("flags\\t\\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\\n")
    ['amx_bf16', 'avx512_bf16']
    >>> bf16_units("flags\\t\\t: fpu sse avx2\\n")
    []
    """
    if cpuinfo is None:
        if not sys.platform.startswith("linux"):
            return []
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
            break
    return [f for f in BF16_FLAGS if f in flags]


@cache
def cpu_autocast() -> Any:
    """``torch.bfloat16`` when the CPU has bfloat16 units, else ``None`` (float32); logged once with
    what was detected (what ``HFEngine(autocast="auto")`` picks on a CPU)."""
    import torch

    units = bf16_units()
    chosen = torch.bfloat16 if units else None
    logger.info(
        "CPU precision: %s; generation and the update run %s (override with HFEngine(autocast=...), "
        "e.g. engine_options={'autocast': None})",
        f"bfloat16 units found ({', '.join(units)})"
        if units
        else "no bfloat16 units (no amx_bf16/avx512_bf16)",
        "under bfloat16 autocast, weights and optimizer states in float32" if units else "in float32",
    )
    return chosen
