"""Identifiers that sort by creation, so SQLite indexes grow at the end instead of at random."""

from __future__ import annotations

import itertools
import os
import threading
import time

# Ids are made in blocks (one format call and one os.urandom call per block, not per id) and handed
# out with list.pop(), which is atomic: each id is taken once, by one thread, in creation order.
_BLOCK = 256
_prefix = ""
_blocks = itertools.count()
_span_ids: list[str] = []  # the current block's span ids, the next one last
_randoms: list[str] = []  # 20 random hex characters each, for rollout ids
_lock = threading.Lock()  # taken only to make the next block


def _reset() -> None:
    # a per-process random prefix, counter and random pool; renewed in a forked child so ids never repeat
    global _prefix, _blocks, _lock
    _prefix = os.urandom(4).hex()
    _blocks = itertools.count()
    _lock = threading.Lock()  # another thread of the parent may have held it
    _span_ids.clear()
    _randoms.clear()


_reset()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset)


def _next_span_ids() -> str:
    with _lock:
        if not _span_ids:
            # hex() of 1, the prefix's 32 bits and a 48-bit counter: "0x1" then the id's 20 characters
            start = (1 << 80 | int(_prefix, 16) << 48) + next(_blocks) * _BLOCK
            _span_ids.extend([hex(i)[3:] for i in range(start + _BLOCK - 1, start - 1, -1)])
        return _span_ids.pop()


def _next_random() -> str:
    with _lock:
        if not _randoms:
            pool = os.urandom(10 * _BLOCK).hex()
            _randoms.extend([pool[i : i + 20] for i in range(0, len(pool), 20)])
        return _randoms.pop()


def new_rollout_id() -> str:
    """A fresh rollout id: 32 hex characters, a millisecond timestamp then 80 random bits.

    >>> a, b = new_rollout_id(), new_rollout_id()
    >>> len(a), a != b, a[:12] <= b[:12]
    (32, True, True)
    """
    try:
        rand = _randoms.pop()
    except IndexError:
        rand = _next_random()
    return f"{time.time_ns() // 1_000_000:012x}{rand}"


def new_span_id() -> str:
    """A fresh span id: 20 hex characters, a per-process random prefix then a counter.

    >>> a, b = new_span_id(), new_span_id()
    >>> len(a), a[:8] == b[:8], a < b
    (20, True, True)
    """
    try:
        return _span_ids.pop()
    except IndexError:
        return _next_span_ids()
