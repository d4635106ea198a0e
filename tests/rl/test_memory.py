"""Host memory: freed heap goes back to the OS after an update; the RSS the metrics report is real."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

import pytest

from agentlightning_lite.rl import _memory

glibc = sys.platform.startswith("linux") and _memory._malloc_trim() is not None


@pytest.mark.skipif(not glibc, reason="malloc_trim is glibc's")
def test_release_returns_freed_heap_pages_to_the_os() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 * 1024, 4096  # 256 MiB in heap-sized blocks (under glibc's mmap threshold)
    blocks = []
    for _ in range(count):
        p = libc.malloc(size)
        ctypes.memset(p, 1, size)  # touch every page: resident
        blocks.append(p)
    held = _memory.rss_mib()
    for p in blocks[:-1]:  # the last block stays: the heap's top cannot shrink on its own
        libc.free(p)
    kept = _memory.rss_mib()
    assert _memory.release_host_memory() is True
    released = _memory.rss_mib()
    libc.free(blocks[-1])
    assert held is not None and kept is not None and released is not None
    assert kept > held - 64, "glibc keeps the freed blocks resident until trimmed"
    assert released < kept - 192, f"malloc_trim gave back {kept - released:.0f} MiB of 256"
    assert _memory.peak_rss_mib() >= held - 1


def test_without_glibc_release_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "_checked", True)
    monkeypatch.setattr(_memory, "_libc", None)
    assert _memory.release_host_memory() is False
