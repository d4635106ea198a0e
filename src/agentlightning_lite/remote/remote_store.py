"""A store that lives on the trainer: spans are batched to it over HTTP, rollouts finished there.

Give it to a :class:`~agentlightning_lite.Tracer` in the runner process and everything that
records through a tracer (the four framework adapters, ``agl.emit_reward``, ``agl.emit_signal``,
``agl.otel.SpanProcessor``) works unchanged: its spans land in the trainer's store.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, cast

from ..store.base import Store
from ..store.rows import SpanRow, span_to_row
from ..types import ROLLOUT_MODES, ROLLOUT_STATUSES, TRUSTED, Rollout, RolloutMode, Span, check_reward
from .client import MAX_LEASES, RemoteError, RunnerClient

__all__ = ["RemoteStore"]

logger = logging.getLogger(__name__)

KEEP = 4096  # rollouts and results cached (the oldest are forgotten; a rollout is then fetched again)


class RemoteStore(Store):
    """A :class:`Store` whose data is the trainer's: writes go over HTTP, batched, with retries.

    Span rows are buffered and sent every ``flush_interval`` seconds or ``batch_size`` rows,
    whichever comes first, by a background thread (retried while the trainer is away; a batch
    it refuses is logged and counted in ``dropped``). ``finish_rollout`` takes the rollout's rows
    still buffered out of the buffer and sends them in the body of its result (one request, one
    lease check: the trainer writes them before it counts the outcome), after any batch already
    in flight with rows of that rollout has been answered, so the trainer has every span before
    it sees the outcome; it never waits for other rollouts' spans. A rollout registered with its
    claim's ``lease`` token gets the token on each of those requests.

    >>> from agentlightning_lite.remote import RemoteStore, RunnerClient
    >>> import agentlightning_lite as agl
    >>> store = RemoteStore(RunnerClient("http://127.0.0.1:8765"))  # doctest: +SKIP
    >>> tracer = agl.Tracer(store)  # doctest: +SKIP
    >>> with tracer.rollout("2+2?") as ro:  # doctest: +SKIP
    ...     agl.emit_reward(1.0)
    """

    def __init__(self, client: RunnerClient, batch_size: int = 512, flush_interval: float = 0.05) -> None:
        self.client = client
        self.batch_size = batch_size
        self.flush_interval = flush_interval
        self.dropped = 0
        self.last_result: OrderedDict[str, dict[str, Any]] = OrderedDict()  # id -> the trainer's answer
        self._rows: list[SpanRow] = []
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()  # one batch in flight at a time: rows arrive in order
        self._in_flight: dict[str, int] = {}  # rollout id -> batches in flight with rows of it
        self._sent = threading.Condition(self._lock)  # notified when a batch is answered
        self._wake = threading.Event()
        self._closed = False
        self._known: OrderedDict[str, Rollout] = OrderedDict()
        self._leases: dict[str, str] = {}  # claimed rollout id -> its lease token (until forgotten)
        self._claim_for: dict[str, str] = {}  # rollout id -> the worker whose next claim its result asks
        self._next: dict[str, dict[str, Any] | None] = {}  # rollout id -> the claim its result brought
        self._thread = threading.Thread(target=self._loop, name="agl-remote-store", daemon=True)
        self._thread.start()

    # -- what the runner tells it ---------------------------------------------------------------
    def register(self, rollout: Rollout, lease: str | None = None) -> None:
        """Remember a rollout claimed from the trainer (no request needed to attach to it).

        ``lease``: the claim's token, sent with the rollout's spans, reward and result.
        """
        with self._lock:
            _remember(self._known, rollout.rollout_id, rollout)
            if lease:
                self._leases[rollout.rollout_id] = lease

    def forget(self, rollout_id: str) -> None:
        """Drop a finished rollout from the local cache."""
        with self._lock:
            self._known.pop(rollout_id, None)
            self.last_result.pop(rollout_id, None)
            self._leases.pop(rollout_id, None)
            self._claim_for.pop(rollout_id, None)
            self._next.pop(rollout_id, None)

    def claim_with_result(self, rollout_id: str, worker: str) -> None:
        """Ask for ``worker``'s next rollout in the same request as ``rollout_id``'s result; what
        the trainer hands out comes from :meth:`take_claim` (one request a rollout, not two).

        >>> from agentlightning_lite.remote import RemoteStore, RunnerClient
        >>> store = RemoteStore(RunnerClient("http://127.0.0.1:8765"))
        >>> store.claim_with_result("ro-1", "box-1/0")
        >>> store.take_claim("ro-1") is None  # no result sent yet: nothing claimed
        True
        >>> store.close(); store.client.close()
        """
        with self._lock:
            self._claim_for[rollout_id] = worker

    def take_claim(self, rollout_id: str) -> dict[str, Any] | None:
        """The claim that came back with ``rollout_id``'s result (see :meth:`claim_with_result`),
        once; ``None`` when none was asked for, none was queued, or the result was not sent."""
        with self._lock:
            self._claim_for.pop(rollout_id, None)
            return self._next.pop(rollout_id, None)

    def lease(self, rollout_id: str) -> str | None:
        """The lease token registered for ``rollout_id``."""
        with self._lock:
            return self._leases.get(rollout_id)

    # -- spans ----------------------------------------------------------------------------------
    def add_span_rows(self, rows: Sequence[SpanRow]) -> None:
        if self._closed:
            raise RuntimeError("the RemoteStore is closed")
        with self._lock:
            self._rows.extend(rows)
            full = len(self._rows) >= self.batch_size
        if full:
            self._wake.set()

    def add_spans(self, spans: Iterable[Span]) -> None:
        self.add_span_rows([span_to_row(s) for s in spans])

    def flush(self) -> None:
        """Send every buffered span now (blocks until the trainer has them or refused them)."""
        with self._send_lock:
            while True:
                with self._lock:
                    batch, self._rows = self._rows[: self.batch_size], self._rows[self.batch_size :]
                    rids = {r[1] for r in batch}
                    for rid in rids:
                        self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
                if not batch:
                    return
                try:
                    self._send(batch)
                finally:
                    with self._lock:
                        for rid in rids:
                            left = self._in_flight.pop(rid) - 1
                            if left:
                                self._in_flight[rid] = left
                        self._sent.notify_all()

    def _send(self, batch: list[SpanRow]) -> None:
        with self._lock:
            leases = {r[1]: self._leases.get(r[1]) for r in batch}
        part: list[SpanRow] = []
        tokens: dict[str, None] = {}
        for r in batch:  # in order, in requests of at most MAX_LEASES rollouts' tokens
            token = leases[r[1]]
            if token and token not in tokens and len(tokens) == MAX_LEASES:
                self._send_part(part, list(tokens))
                part, tokens = [], {}
            if token:
                tokens[token] = None
            part.append(r)
        if part:
            self._send_part(part, list(tokens))

    def _send_part(self, rows: list[SpanRow], leases: list[str]) -> None:
        try:
            accepted = self.client.add_rows([list(r) for r in rows], leases=leases)
        except RemoteError as exc:
            self._drop(len(rows))
            logger.error("the trainer refused %d spans: %s", len(rows), exc)
            return
        if accepted < len(rows):  # spans of rollouts that ended (their attempt was given up)
            self._drop(len(rows) - accepted)
            logger.error("the trainer dropped %d spans of ended rollouts", len(rows) - accepted)

    def _drop(self, n: int) -> None:
        with self._lock:
            self.dropped += n

    def _take_rows(self, rollout_id: str) -> list[SpanRow]:
        """Take ``rollout_id``'s buffered rows out of the buffer, once no batch with rows of it is
        in flight (those reach the trainer first)."""
        with self._lock:
            mine = [r for r in self._rows if r[1] == rollout_id]
            if mine:
                self._rows = [r for r in self._rows if r[1] != rollout_id]
            while self._in_flight.get(rollout_id):
                self._sent.wait()
        return mine

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self.flush_interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # keep the flusher alive whatever happens
                logger.exception("RemoteStore: flushing spans failed")

    def spans(self, rollout_id: str) -> list[Span]:
        self.flush()
        return [Span.model_validate(s, context=TRUSTED) for s in self.client.spans(rollout_id)]

    # -- rollouts -------------------------------------------------------------------------------
    def start_rollout(
        self,
        task: Any = None,
        mode: str = "trace",
        metadata: dict[str, Any] | None = None,
        rollout_id: str | None = None,
    ) -> Rollout:
        if mode not in ROLLOUT_MODES:
            raise ValueError(f"mode must be one of {ROLLOUT_MODES}, got {mode!r}")
        local = Rollout(
            rollout_id=rollout_id or "-",
            task=task,
            mode=cast(RolloutMode, mode),  # checked against ROLLOUT_MODES above
            start_time=0.0,
            metadata=metadata or {},
        )
        body = local.model_dump(mode="json", include={"task", "mode", "metadata"})
        body["rollout_id"] = rollout_id
        ro = Rollout.model_validate(self.client.start_rollout(body), context=TRUSTED)
        self.register(ro)
        return ro

    def finish_rollout(
        self,
        rollout_id: str,
        status: str = "succeeded",
        reward: float | None = None,
        error: str | None = None,
        only_if_running: bool = False,
    ) -> Rollout:
        if status not in ROLLOUT_STATUSES or status == "running":
            raise ValueError(f"status must be one of succeeded/failed/timeout, got {status!r}")
        reward = check_reward(reward)
        rows = self._take_rows(rollout_id)
        with self._lock:
            worker = self._claim_for.pop(rollout_id, None)
        try:
            answer = self.client.complete(
                rollout_id,
                status=status,
                reward=reward,
                error=error,
                lease=self.lease(rollout_id),
                rows=[list(r) for r in rows],
                claim_for=worker,
            )
        except RemoteError as exc:
            if rows:
                self._drop(len(rows))
                logger.error("rollout %s: %d spans sent with its result lost: %s", rollout_id, len(rows), exc)
            raise
        lost = int(answer.get("dropped", 0)) if "accepted" in answer else len(rows)
        if lost:
            self._drop(lost)
            why = "attempt given up" if "accepted" in answer else "the trainer takes none with a result"
            logger.error("rollout %s: the trainer dropped %d spans (%s)", rollout_id, lost, why)
        with self._lock:
            if worker is not None:
                self._next[rollout_id] = answer.pop("next", None)
            _remember(self.last_result, rollout_id, answer)
            known = self._known.get(rollout_id)
        base = known or Rollout(rollout_id=rollout_id, start_time=0.0)
        update: dict[str, Any] = {"status": status, "error": error}
        if reward is not None:
            update["reward"] = reward
        return base.model_copy(update=update)

    def set_reward(self, rollout_id: str, reward: float) -> None:
        reward = check_reward(reward)  # type: ignore[assignment]
        self.client.set_reward(rollout_id, reward, lease=self.lease(rollout_id))

    def get_rollout(self, rollout_id: str) -> Rollout | None:
        with self._lock:
            known = self._known.get(rollout_id)
        if known is not None:
            return known
        data = self.client.get_rollout(rollout_id)
        return None if data is None else Rollout.model_validate(data, context=TRUSTED)

    def rollouts(self, mode: str | None = None, status: str | None = None) -> list[Rollout]:
        return [Rollout.model_validate(r, context=TRUSTED) for r in self.client.rollouts(mode, status)]

    def insert_rollout(self, rollout: Rollout) -> None:  # pragma: no cover - start_rollout is remote
        raise NotImplementedError

    def update_rollout(self, rollout: Rollout) -> None:  # pragma: no cover - finish_rollout is remote
        raise NotImplementedError

    def close(self) -> None:
        """Send what is buffered, stop the flusher (the client stays open: it is the caller's)."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            self._wake.set()
            self._thread.join(5.0)

    def __repr__(self) -> str:
        return f"RemoteStore({self.client.url!r})"


def _remember(cache: OrderedDict[str, Any], key: str, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > KEEP:
        cache.popitem(last=False)
