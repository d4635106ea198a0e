"""The rollout queue's records: a job (one rollout the trainer asked for), an attempt at it (a claim by
one runner worker under a lease, with its unguessable token), what is kept of an ended attempt, the
lease check, the errors a request without a valid lease raises, and what became of the span rows
sent with a result."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConflictError, LeaseError
from ..store.base import Store
from ..store.rows import SpanRow

__all__ = [
    "Attempt",
    "EndedAttempt",
    "Job",
    "LeaseLost",
    "LeaseMismatch",
    "OutcomeCounted",
    "lease_ok",
    "rows_outcome",
]

logger = logging.getLogger(__name__)


class LeaseLost(LeaseError):
    """A heartbeat or result for an attempt whose lease is no longer held (expired, timed out, done)."""


class LeaseMismatch(LeaseError):
    """A request for a claimed rollout that does not carry that claim's lease token."""


class OutcomeCounted(ConflictError):
    """A change to a rollout whose outcome is counted already (succeeded, failed or timed out)."""


@dataclass
class Job:
    """One rollout the trainer asked for, and what became of it."""

    job_id: int
    task: Any
    mode: str
    metadata: dict[str, Any]
    attempts: int = 0
    rollout_id: str | None = None  # the current (or last) attempt's rollout
    status: str | None = None  # None while queued or running; then succeeded / failed / timeout
    reward: float | None = None
    error: str | None = None
    queued_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def done(self) -> bool:
        """Whether the job has its one outcome."""
        return self.status is not None


@dataclass
class Attempt:
    """One claim of a job by one runner worker: a rollout in the store, under a lease."""

    rollout_id: str
    job: Job
    worker: str
    weights_version: int
    claimed_at: float
    lease_expires: float
    deadline: float | None
    state: str = "running"  # running, done, expired, timeout
    lease: str = field(default_factory=lambda: secrets.token_urlsafe(24), repr=False)

    def public(self) -> dict[str, Any]:
        """What the runner gets back from a claim."""
        return {
            "rollout_id": self.rollout_id,
            "task": self.job.task,
            "mode": self.job.mode,
            "metadata": self.job.metadata,
            "attempt": self.job.attempts,
            "weights_version": self.weights_version,
            "timeout": None if self.deadline is None else max(0.0, self.deadline - self.claimed_at),
            "lease": self.lease,
        }


@dataclass(slots=True)
class EndedAttempt:
    """What is kept of an attempt that ended: enough for a late result or a retried call."""

    lease: str
    weights_version: int
    state: str  # done, expired, timeout
    status: str | None  # the job's outcome when this attempt's result was counted (state done)
    next_claim: str | None = None  # the rollout claimed with its result (a retried result gets it again)


def lease_ok(lease: str, leases: Collection[str] | None) -> bool:
    """Whether ``leases`` (the tokens a request carries; ``None``: an in-process caller) hold ``lease``."""
    if leases is None:
        return True
    return any(isinstance(t, str) and secrets.compare_digest(t, lease) for t in leases)


def rows_outcome(
    store: Store, rollout_id: str, rows: Sequence[SpanRow], accepted: int, duplicate: bool
) -> dict[str, int]:
    """What became of the span rows sent with a result: ``accepted`` (written), ``stored_before``
    (a retried result: the first call wrote them) and ``dropped`` (the attempt was given up)."""
    out = {"accepted": accepted}
    left = len(rows) - accepted
    if left and duplicate and not accepted:
        have = {s.span_id for s in store.spans(rollout_id)}
        before = sum(1 for r in rows if r[0] in have)
        if before:
            out["stored_before"] = before
        left -= before
    if left:
        out["dropped"] = left
        logger.warning("rollout %s: %d span rows sent with a late result dropped", rollout_id, left)
    return out
