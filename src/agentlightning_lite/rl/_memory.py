"""Host memory of the training process: give the allocator's free heap back, read the RSS.

A CPU update allocates activations of many sizes and frees them; glibc keeps most of the freed memory in
its heap, so after the first update the process stays at its peak RSS for good (6.6 GiB after an update
of the embedded model over 4 x 2 x 800 tokens, of which 0.9 GiB is in use: ``benchmarks/perf/
memory_results.md``). The trainer calls :func:`release_host_memory` (``malloc_trim(0)``) after each update
and evaluation: the peak is unchanged, the resident size between updates falls back to what is in use,
which is what matters when an engine server, rollout workers or several runs share one machine.
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


def _malloc_trim() -> Any:
    """glibc's ``malloc_trim`` or ``None`` (macOS, Windows, musl)."""
    global _libc, _checked
    if not _checked:
        _checked = True
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                _libc = lib if hasattr(lib, "malloc_trim") else None
            except OSError:
                _libc = None
    return getattr(_libc, "malloc_trim", None)


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
