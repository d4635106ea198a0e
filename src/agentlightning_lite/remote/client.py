"""The HTTP client a runner talks to the trainer with: every call retried with backoff while it is away.

Connection errors, timeouts, 502/503/504 (a proxy in front of a trainer that is away), 408 and 429
are retried (exponential backoff with jitter, up to ``max_backoff`` seconds between tries) for
``give_up_after`` seconds (``None``: for ever, so a runner outlives a trainer restart). A trainer
that answers with another 5xx (500: a failure in its handler) is asked again ``server_error_retries``
times with the same backoff, then :class:`RemoteError` says what it answered; other 4xx answers raise
:class:`RemoteError` at once.

A claim's ``lease`` token goes with every heartbeat, result, reward and span batch of that
rollout, in the ``X-AGL-Lease`` header (the ``lease``/``leases`` arguments below).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any
from urllib.parse import quote

import httpx

from ..errors import AGLError

__all__ = ["LEASE_HEADER", "RemoteError", "RunnerClient"]

LEASE_HEADER = "X-AGL-Lease"
MAX_LEASES = 64  # tokens per request: the header stays small (HTTP servers cap headers at 16 KiB or so)

logger = logging.getLogger(__name__)

_AWAY_STATUS = frozenset({408, 429, 502, 503, 504})  # retried like a connection error


class RemoteError(AGLError):
    """The trainer refused a request (a 4xx answer), or stayed away longer than ``give_up_after``."""

    def __init__(self, status: int | None, message: str, code: str | None = None) -> None:
        super().__init__(message if status is None else f"{status}: {message}")
        self.status = status
        self.code = code


class RunnerClient:
    """A thread-safe client of the trainer's runner routes (``/agl/v1/...``).

    >>> from agentlightning_lite.remote import RunnerClient
    >>> client = RunnerClient("http://127.0.0.1:8765", api_key="secret")
    >>> client.url
    'http://127.0.0.1:8765'
    >>> client.claim("worker-1", wait=10.0)  # doctest: +SKIP
    {'rollout_id': '...', 'task': ..., 'llm_path': '/rollout/.../v1', 'weights_version': 3, ...}
    >>> client.close()
    """

    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        timeout: float = 60.0,
        give_up_after: float | None = None,
        max_backoff: float = 5.0,
        max_connections: int = 64,
        transport: httpx.BaseTransport | None = None,
        server_error_retries: int = 5,
    ) -> None:
        if server_error_retries < 0:
            raise ValueError(f"server_error_retries must be >= 0, got {server_error_retries}")
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.give_up_after = give_up_after
        self.max_backoff = max_backoff
        self.server_error_retries = server_error_retries
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )
        self._closed = threading.Event()
        self.reconnects = 0  # how many times a call had to wait for the trainer

    # -- transport ------------------------------------------------------------------------------
    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        timeout: float | None = None,
        leases: list[str] | None = None,
    ) -> Any:
        """Send one request, retrying while the trainer is unreachable; returns the decoded JSON.

        ``leases``: the lease tokens of the claimed rollouts the request acts on.
        """
        start = time.monotonic()
        delay = 0.1
        attempt = 0
        server_errors = 0
        while True:
            attempt += 1
            problem: str
            try:
                kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
                if leases:
                    kwargs["headers"] = {LEASE_HEADER: ",".join(leases)}
                resp = self._http.request(method, path, json=json, **kwargs)
            except httpx.TransportError as exc:
                if self._closed.is_set():
                    raise RemoteError(None, "the client is closed") from None
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 400:
                    if attempt > 1:
                        logger.info("reached the trainer at %s again", self.url)
                    return resp.json() if resp.content else None
                if resp.status_code >= 500 and resp.status_code not in _AWAY_STATUS:
                    server_errors += 1
                    if server_errors > self.server_error_retries:
                        message, code = _error_of(resp)
                        raise RemoteError(
                            resp.status_code,
                            f"the trainer at {self.url} failed {method} {path} {server_errors} times in a "
                            f"row (see the trainer's log): {message}",
                            code,
                        )
                elif resp.status_code not in _AWAY_STATUS:
                    message, code = _error_of(resp)
                    raise RemoteError(resp.status_code, message, code)
                problem = f"HTTP {resp.status_code}"
            waited = time.monotonic() - start
            if self.give_up_after is not None and waited > self.give_up_after:
                raise RemoteError(None, f"the trainer at {self.url} is unreachable ({problem})")
            if attempt == 1:
                self.reconnects += 1
            if attempt in (1, 10) or attempt % 60 == 0:
                logger.warning("the trainer at %s: %s; retrying (%.0f s so far)", self.url, problem, waited)
            if self._closed.wait(delay * (0.5 + random.random())):
                raise RemoteError(None, "the client is closed")
            delay = min(self.max_backoff, delay * 2)

    def close(self) -> None:
        """Stop retrying and close the connections."""
        self._closed.set()
        self._http.close()

    def __enter__(self) -> RunnerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the routes -----------------------------------------------------------------------------
    def claim(self, worker: str, wait: float = 10.0) -> dict[str, Any] | None:
        """Claim the next rollout (waiting up to ``wait`` s); ``None`` when none was queued."""
        out = self.request("POST", "/agl/v1/claim", {"worker": worker, "wait": wait}, timeout=wait + 30.0)
        return out.get("rollout") if out else None

    def heartbeat(self, worker: str, rollout_ids: list[str], leases: list[str] | None = None) -> list[str]:
        """Renew leases; returns the rollout ids whose lease is lost.

        ``leases``: the claims' tokens, one per rollout id, in the same order (sent
        :data:`MAX_LEASES` rollouts per request).
        """
        if leases is not None and len(leases) != len(rollout_ids):
            raise ValueError("give one lease token per rollout id")
        lost: list[str] = []
        for k in range(0, len(rollout_ids), MAX_LEASES):
            body = {"worker": worker, "rollout_ids": rollout_ids[k : k + MAX_LEASES]}
            tokens = None if leases is None else [t for t in leases[k : k + MAX_LEASES] if t]
            out = self.request("POST", "/agl/v1/heartbeat", body, leases=tokens)
            lost.extend(out.get("lost", ()) if out else ())
        return lost

    def complete(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        lease: str | None = None,
        rows: list[Any] | None = None,
        claim_for: str | None = None,
    ) -> dict[str, Any]:
        """Report a rollout's result; ``counted`` says whether it is the rollout's outcome.

        ``rows``: the rollout's span rows not sent yet (the store's row layout), written by the
        trainer under the same lease check before it counts the outcome; the answer says how
        many it ``accepted`` (and ``dropped``, when the attempt had been given up).
        ``claim_for``: a worker id; the answer's ``next`` is then that worker's next rollout, as
        :meth:`claim` answers it without waiting (``None`` when nothing is queued).
        """
        body: dict[str, Any] = {"status": status, "reward": reward, "error": error}
        if rows is not None:
            body["rows"] = rows
        if claim_for is not None:
            body["claim"] = {"worker": claim_for}
        path = f"/agl/v1/rollouts/{_q(rollout_id)}/complete"
        return self.request("POST", path, body, leases=[lease] if lease else None) or {}

    def set_reward(self, rollout_id: str, reward: float, lease: str | None = None) -> None:
        """Record a rollout's final reward without finishing it (refused once its outcome is counted)."""
        path = f"/agl/v1/rollouts/{_q(rollout_id)}/reward"
        self.request("POST", path, {"reward": reward}, leases=[lease] if lease else None)

    def add_rows(self, rows: list[Any], leases: list[str] | None = None) -> int:
        """Send span rows (the store's row layout); returns how many were accepted."""
        out = self.request("POST", "/agl/v1/spans", {"rows": rows}, leases=leases)
        return int(out.get("accepted", 0)) if out else 0

    def start_rollout(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create a rollout in the trainer's store (``task``, ``mode``, ``metadata``, ``rollout_id``)."""
        return self.request("POST", "/agl/v1/rollouts", body)

    def get_rollout(self, rollout_id: str) -> dict[str, Any] | None:
        """A rollout of the trainer's store, or ``None``."""
        try:
            return self.request("GET", f"/agl/v1/rollouts/{_q(rollout_id)}")
        except RemoteError as exc:
            if exc.status == 404:
                return None
            raise

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[dict[str, Any]]:
        """The rollouts of the trainer's store."""
        params = "&".join(f"{k}={v}" for k, v in (("mode", mode), ("status", status)) if v)
        return self.request("GET", "/agl/v1/rollouts" + (f"?{params}" if params else ""))["rollouts"]

    def spans(self, rollout_id: str) -> list[dict[str, Any]]:
        """The spans of one rollout in the trainer's store."""
        return self.request("GET", f"/agl/v1/rollouts/{_q(rollout_id)}/spans")["spans"]

    def status(self) -> dict[str, Any]:
        """The queue's counts and the weights version."""
        return self.request("GET", "/agl/v1/status")


def _q(rollout_id: str) -> str:
    return quote(rollout_id, safe="")


def _error_of(resp: httpx.Response) -> tuple[str, str | None]:
    try:
        err = resp.json().get("error") or {}
        return str(err.get("message") or resp.text), err.get("code")
    except (ValueError, AttributeError):
        return resp.text[:500], None
