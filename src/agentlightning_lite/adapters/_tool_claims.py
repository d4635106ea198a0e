"""The framework ``tool`` spans open right now, so that a layer below the framework that sees the same call
(the MCP client's ``call_tool``) completes the framework's span instead of recording a second one.

:class:`~agentlightning_lite.adapters.Recorder` adds each ``tool`` span it opens and removes it when it
ends; :func:`claim` hands an open span to the layer below for the length of one call.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..store.base import Store
from ..tracer import SpanHandle

__all__ = ["OpenTool", "add", "claim", "open_count", "release", "remove"]


@dataclass(eq=False)
class OpenTool:
    """One open framework ``tool`` span (written to ``store``): ``busy`` while a call below it is in flight,
    ``calls`` made below it so far, ``failed`` when the layer below marked it failed."""

    handle: SpanHandle
    store: Store
    busy: bool = False
    calls: int = 0
    failed: bool = False
    seq: int = field(default=0)


_lock = threading.Lock()
_open: list[OpenTool] = []
_seq = 0


def add(handle: SpanHandle, store: Store) -> None:
    """Register an open framework ``tool`` span, written to ``store``."""
    global _seq
    with _lock:
        _seq += 1
        _open.append(OpenTool(handle, store, seq=_seq))


def remove(handle: SpanHandle) -> None:
    """Forget a framework ``tool`` span that is ending."""
    with _lock:
        _open[:] = [o for o in _open if o.handle is not handle]


def _matches(span_name: str, tool: str) -> bool:
    # a framework may prefix the tool's name with its server's ("calc_add", "calc__add", "calc.add")
    if span_name == tool:
        return True
    return span_name.endswith(tool) and not span_name[-len(tool) - 1].isalnum()


def claim(tool: str, rollout_id: str | None) -> OpenTool | None:
    """The open framework span of a call to ``tool``, now busy; ``None`` when there is none.

    Of the spans not busy whose name is ``tool`` (or ends in ``_tool``, ``.tool``...) and, when a rollout
    is open (``rollout_id``), that belong to it: exact names first, the earliest opened first. A span may
    be claimed again after :func:`release` (a retried call), for as long as the framework keeps it open.

    >>> import agentlightning_lite as agl
    >>> tracer = agl.Tracer()
    >>> with tracer.rollout("q") as ro:
    ...     h = tracer.start_span("tool", "srv_add", rollout_id=ro.id)
    ...     add(h, tracer.store)
    ...     first, second = claim("add", ro.id), claim("add", ro.id)
    ...     release(first)
    ...     other_rollout, again = claim("add", "another-rollout"), claim("add", ro.id)
    ...     remove(h); h.end()
    >>> (first.handle is h, second, other_rollout, again is first, first.calls)
    (True, None, None, True, 2)
    """
    with _lock:
        found = [
            o
            for o in _open
            if not o.busy
            and _matches(o.handle.name, tool)
            and (rollout_id is None or o.handle.rollout_id == rollout_id)
        ]
        if not found:
            return None
        found.sort(key=lambda o: (o.handle.name != tool, o.seq))
        chosen = found[0]
        chosen.busy = True
        chosen.calls += 1
        return chosen


def release(claimed: OpenTool) -> None:
    """The call below a claimed span has finished."""
    with _lock:
        claimed.busy = False


def open_count() -> int:
    """How many framework ``tool`` spans are open (for tests: 0 after a run)."""
    with _lock:
        return len(_open)
