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


HOARD = """
import ctypes, ctypes.util, sys
from agentlightning_lite.rl import _memory
if sys.argv[1] == "limit":
    assert _memory.limit_heap_retention(1.0) is True
libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
big = libc.malloc(16 * 2**20)  # a mapped block freed: glibc's dynamic threshold rises to 16 MiB
libc.free(big)
base = _memory.rss_mib()
blocks, pins = [], []
for _ in range(64):  # 256 MiB in 4 MiB blocks, each followed by a smaller block that stays (a layer's output)
    p = libc.malloc(4 * 2**20)
    ctypes.memset(p, 1, 4 * 2**20)
    blocks.append(p)
    pins.append(libc.malloc(256 * 2**10))
for p in blocks:
    libc.free(p)
print(_memory.rss_mib() - base)
"""


@pytest.mark.skipif(not glibc, reason="mallopt is glibc's")
@pytest.mark.parametrize("mode", ["default", "limit"])
def test_heap_retention_limit_returns_freed_activation_sized_blocks(mode: str) -> None:
    """The pattern of an update: activation-sized blocks freed while small ones live on. glibc's
    defaults keep all of it resident; with the trainer's limit it goes back as each block is freed."""
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", HOARD, mode], env=env, capture_output=True, text=True, check=True
    )
    kept = float(out.stdout.strip().splitlines()[-1])
    if mode == "default":
        assert kept > 200, f"glibc's defaults kept only {kept:.0f} MiB of 256 freed"
    else:
        assert kept < 32, f"{kept:.0f} MiB of 256 freed stayed resident"


def test_heap_retention_defers_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "4194304")
    assert _memory.limit_heap_retention(1.0) is False


def test_trainer_defaults_are_the_lean_ones() -> None:
    from agentlightning_lite.rl.config import UpdateConfig

    assert UpdateConfig().gradient_checkpointing is None  # on where memory is short (test_step_cost.py)
    assert UpdateConfig().host_mmap_threshold_mib == "auto"
    with pytest.raises(ValueError, match="host_mmap_threshold_mib"):
        UpdateConfig(host_mmap_threshold_mib=64)
