"""Host memory of the training process: keep the allocator from hoarding freed activations, read the RSS.

A CPU update allocates activations of many sizes and frees them. With glibc's default settings most of
the freed memory stays in its heap, fragmented: an update of the embedded model over 4 x 2 x 800 tokens
peaked at 6.7 GiB (3.5 GiB with gradient checkpointing, whose saved activations are 0.1 GiB), of which
0.9 GiB is the model (``benchmarks/perf/memory_results.md``). Two remedies, both applied by the trainer:
:func:`limit_heap_retention` when it starts (large blocks get their own mappings, unmapped when freed:
the peak follows what is in use) and :func:`release_host_memory` (``malloc_trim(0)``) after each update
and evaluation (the rest of the free heap goes back to the system).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
from typing import Any

_libc: Any = None
_checked = False
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h


def _glibc(name: str) -> Any:
    """A function of glibc (``malloc_trim``, ``mallopt``), or ``None`` off glibc (macOS, Windows, musl)."""
    global _libc, _checked
    if not _checked:
        _checked = True
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = lib if hasattr(lib, "malloc_trim") else None
            except OSError:
                _libc = None
    return getattr(_libc, name, None)


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` or ``None``."""
    return _glibc("malloc_trim")


def limit_heap_retention(threshold_mib: float = 1.0) -> bool:
    """Serve host memory blocks of ``threshold_mib`` MiB or more with their own mappings, unmapped when
    freed (glibc ``mallopt(M_MMAP_THRESHOLD, ...)``, process-wide); whether it was set. Not set off
    glibc, nor when the environment already sets ``MALLOC_MMAP_THRESHOLD_`` (the user's choice wins).

    glibc's default threshold is dynamic: it rises to the size of the largest mapped block freed (up
    to 32 MiB), so after the first update the activations come from the heap, whose freed pages stay
    resident and fragment; the process then sits near 4x the memory the update actually uses.

    >>> isinstance(limit_heap_retention(1.0), bool)
    True
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    mallopt = _glibc("mallopt")
    if mallopt is None:
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold_mib * 2**20)))


def release_host_memory() -> bool:
    """Return the C heap's free pages to the operating system (glibc ``malloc_trim(0)``); whether it
    could. Cheap next to a training step (milliseconds) and a no-op off glibc.

    >>> isinstance(release_host_memory(), bool)
    True
    """
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def rss_mib() -> float | None:
    """The process's resident set size now, in MiB (Linux ``/proc/self/statm``; ``None`` elsewhere).

    >>> rss_mib() is None or rss_mib() > 1
    True
    """
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    """The process's peak resident set size so far, in MiB (``getrusage``).

    >>> peak_rss_mib() >= (rss_mib() or 0) - 1
    True
    """
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB elsewhere


def available_mib() -> float | None:
    """Memory the system can give this process now, in MiB (Linux ``MemAvailable``; ``None`` elsewhere)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def estimate_update_peak_mib(model: Any, micro_batch_tokens: int, autocast: Any = None) -> float:
    """A conservative estimate of the activations a micro-batch of ``micro_batch_tokens`` tokens keeps
    for the backward pass without gradient checkpointing, in MiB.

    Per decoder layer and token: about 16 hidden-size and 6 intermediate-size vectors (the norms'
    inputs, q/k/v/o, the MLP's gate, up, activation and product, LoRA's inputs), and the attention
    probabilities (heads x the row's length, the row taken as the whole micro-batch); 4 bytes each
    in float32, 2 for what runs under bfloat16 autocast (the linear layers' outputs). Checked against
    the embedded model's float32 update over micro-batches of 1,600 tokens without the savers: 6,011 MiB
    estimated, 5,909 MiB measured above the loaded model (``benchmarks/perf/memory_results.md``).

    >>> from types import SimpleNamespace
    >>> smollm2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9)
    >>> round(estimate_update_peak_mib(SimpleNamespace(config=SimpleNamespace(**smollm2)), 2048))
    8640
    """
    cfg = getattr(model, "config", None)
    h = int(getattr(cfg, "hidden_size", 0) or 0)
    inter = int(getattr(cfg, "intermediate_size", 0) or 4 * h)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 1)
    if not h or not layers:
        return float("inf")  # unknown architecture: assume the savers are needed
    width = 2 if autocast is not None else 4
    per_token = layers * ((16 * h + 6 * inter) * width + heads * micro_batch_tokens * 4)
    return micro_batch_tokens * per_token / 2**20
