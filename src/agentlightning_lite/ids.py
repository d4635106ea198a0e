"""Identifiers that sort by creation, so SQLite indexes grow at the end instead of at random."""

from __future__ import annotations

import itertools
import os
import time

_prefix = ""
_counter = itertools.count()


def _reset() -> None:
    # a per-process random prefix and counter; renewed in a forked child so ids never repeat
    global _prefix, _counter
    _prefix = os.urandom(4).hex()
    _counter = itertools.count()


_reset()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset)


def new_rollout_id() -> str:
    """A fresh rollout id: 32 hex characters, a millisecond timestamp then 80 random bits.

    >>> a, b = new_rollout_id(), new_rollout_id()
    >>> len(a), a != b, a[:12] <= b[:12]
    (32, True, True)
    """
    return f"{time.time_ns() // 1_000_000:012x}{os.urandom(10).hex()}"


def new_span_id() -> str:
    """A fresh span id: 20 hex characters, a per-process random prefix then a counter.

    >>> a, b = new_span_id(), new_span_id()
    >>> len(a), a[:8] == b[:8], a < b
    (20, True, True)
    """
    return f"{_prefix}{next(_counter):012x}"
