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


_CHURN = """
import ctypes, ctypes.util, json, sys
from agentlightning_lite.rl import _memory
if sys.argv[1] == "mapped":
    assert _memory.map_large_blocks(1 << 20) is True
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 4 << 20  # an activation-sized block
libc.free(libc.malloc(size))  # freeing an mmapped block raises glibc's dynamic threshold past it
blocks = [libc.malloc(size) for _ in range(64)]  # 256 MiB
for p in blocks:
    ctypes.memset(p, 1, size)
held = _memory.rss_mib()
for p in blocks[:-1]:
    libc.free(p)
print(json.dumps({"held": held, "after_free": _memory.rss_mib()}))
"""


@pytest.mark.skipif(not glibc, reason="mallopt is glibc's")
def test_map_large_blocks_returns_freed_activations_without_a_trim() -> None:
    import json
    import subprocess

    def run(mode: str) -> dict[str, float]:
        out = subprocess.run([sys.executable, "-c", _CHURN, mode], capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])

    heap, mapped = run("heap"), run("mapped")
    assert heap["after_free"] > heap["held"] - 64, "by default the freed 4 MiB blocks stay resident"
    assert mapped["after_free"] < mapped["held"] - 192, "mapped blocks go back to the OS when freed"
