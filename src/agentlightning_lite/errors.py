"""The package's exception family: what a caller did wrong, told apart from a bug inside the package.

Every error the package raises for a condition its caller caused (an unknown rollout, a request
that breaks the rules, a lease that is not held, a change that conflicts with the recorded state)
is an :class:`AGLError`. The HTTP servers map these, and only these, to 4xx answers at their
edge (see :func:`agentlightning_lite.serving.errors.api_error_of`); any other exception inside a
handler is a bug and answers 500 with a generic message (its traceback goes to the log).

Each class also derives from the built-in exception code used to catch before the family
existed (``KeyError``, ``ValueError``, ``PermissionError``), so ``except KeyError`` still works.

>>> from agentlightning_lite.errors import AGLError, UnknownRolloutError
>>> err = UnknownRolloutError("r-1")
>>> isinstance(err, AGLError), isinstance(err, KeyError), str(err)
(True, True, "unknown rollout 'r-1'")
"""

from __future__ import annotations

__all__ = [
    "AGLError",
    "ConflictError",
    "InvalidRequestError",
    "LeaseError",
    "RolloutExistsError",
    "UnknownRolloutError",
]


class AGLError(Exception):
    """The base of every error the package raises for a condition its caller caused."""


class InvalidRequestError(AGLError, ValueError):
    """A request or argument that breaks the rules (HTTP 400)."""


class UnknownRolloutError(AGLError, KeyError):
    """A rollout id that the store (or the queue) does not know (HTTP 404)."""

    def __init__(self, rollout_id: str, message: str | None = None) -> None:
        super().__init__(message or f"unknown rollout {rollout_id!r}")
        self.rollout_id = rollout_id

    def __str__(self) -> str:  # KeyError quotes its argument; this one is a sentence
        return str(self.args[0])


class LeaseError(AGLError, PermissionError):
    """A request for a claimed rollout without that claim's lease token (HTTP 403)."""


class ConflictError(AGLError):
    """A change that conflicts with what is recorded (HTTP 409)."""


class RolloutExistsError(ConflictError, ValueError):
    """``start_rollout`` with the id of a rollout that exists already (HTTP 409)."""
