"""Rollouts left ``running`` by a process that died: find them, and mark them ``failed`` ("interrupted").

Every rollout records the process that started it in ``metadata["agl.owner"]``
(``{"pid": ..., "host": ...}``). A ``running`` rollout is *stale* when its owner is gone:

- owner on this host: the process ``pid`` no longer exists (``os.kill(pid, 0)``), or is a zombie;
- owner on another host, or no owner recorded (a store written before owners were recorded): it
  started more than ``older_than`` seconds ago, when ``older_than`` is given; otherwise it is
  left alone, since its process cannot be checked from here.

Limits: a pid reused by a new process on the same host makes a dead owner look alive (its
rollouts stay ``running`` until that process ends too; ``older_than`` does not override a live
pid). Processes in separate pid namespaces that share a host name (containers) should pass
``older_than`` and not rely on the pid check.
"""

from __future__ import annotations

import os
import time

from ..types import Rollout
from .base import OWNER_KEY, Store, host_name, owner

__all__ = ["INTERRUPTED", "OWNER_KEY", "owner", "owner_alive", "recover_interrupted", "stale_running"]

#: the ``error`` of a rollout marked failed because its process died
INTERRUPTED = "interrupted"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    except OSError:
        return False
    try:  # Linux: a killed process not yet reaped by its parent (a zombie) is gone as well
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except (OSError, IndexError):
        return True


def owner_alive(rollout: Rollout) -> bool | None:
    """Whether the process that started ``rollout`` still runs: ``None`` when it cannot be told
    (no owner recorded, or an owner on another host)."""
    info = rollout.metadata.get(OWNER_KEY)
    if not isinstance(info, dict):
        return None
    pid, host = info.get("pid"), info.get("host")
    if not isinstance(pid, int) or host != host_name():
        return None
    return _pid_alive(pid)


def stale_running(
    rollouts: list[Rollout], older_than: float | None = None, now: float | None = None
) -> list[Rollout]:
    """The ``running`` rollouts among ``rollouts`` whose process is gone (see the module docs)."""
    now = time.time() if now is None else now
    out = []
    for r in rollouts:
        if r.status != "running":
            continue
        alive = owner_alive(r)
        if alive is False or (alive is None and older_than is not None and now - r.start_time > older_than):
            out.append(r)
    return out


def recover_interrupted(store: Store, older_than: float | None = None) -> list[Rollout]:
    """Mark the stale ``running`` rollouts of ``store`` ``failed`` with error ``"interrupted"``.

    Returns the rollouts marked. A rollout that its process finishes meanwhile is left as it is.

    >>> import agentlightning_lite as agl
    >>> store = agl.MemoryStore()
    >>> ro = store.start_rollout("q", metadata={"agl.owner": {"pid": 0, "host": owner()["host"]}})
    >>> [r.rollout_id == ro.rollout_id for r in recover_interrupted(store)]
    [True]
    >>> store.get_rollout(ro.rollout_id).status, store.get_rollout(ro.rollout_id).error
    ('failed', 'interrupted')
    """
    marked = []
    for r in stale_running(store.rollouts(status="running"), older_than):
        done = store.finish_rollout(r.rollout_id, status="failed", error=INTERRUPTED, only_if_running=True)
        if done.status == "failed" and done.error == INTERRUPTED:
            marked.append(done)
    return marked
