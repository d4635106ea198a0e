"""Continuous batching for the HF engine: between decoding steps, ended rows resolve their futures and
leave, waiting requests of the running adapter join (prefilled, a shared prompt once)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .batching import Item
from .hf_decode import DecodeCounters, Row, RowBatch
from .hf_kvcache import PrefixCache

__all__ = ["ContinuousBatching"]

_NONE_LEFT = object()


class ContinuousBatching:
    """The HF engine's scheduler (a mixin of :class:`~.hf.HFEngine`): it reads the engine's model,
    lock, waiting requests and counters, set up by the engine's constructor."""

    if TYPE_CHECKING:  # what the engine provides
        model: Any
        lock: Any
        max_batch_size: int
        prefix_cache_size: int
        prefix_cache_bytes: int
        _pending: Any
        _stopping: bool
        _busy_counted: bool
        _updates_waiting: int

        def __getattr__(self, name: str) -> Any: ...

    def _serve_continuously(self, batch: list[Item]) -> None:
        """Serve ``batch`` (the first requests, collected by the batching loop) and every request that
        arrives while rows are decoding, until no row is left; then the engine's loop collects the next
        requests as it collected these (its batch window, :meth:`~.BatchingEngine.expect`).

        Rows of one adapter decode at a time (a *group*, under ``self.lock``): a group starts with every
        waiting request of the adapter of the oldest waiting request (up to ``max_batch_size``), and
        requests of that adapter arriving later join it while no request of another adapter waits; once
        one does, the group takes no more and drains, and the next group is that request's adapter. A
        weight update waiting for the lock (:meth:`HFEngine.update_weights`) stops admission the same way.
        The prefix cache lives as long as a group: the weights cannot change under it."""
        self._pending.extendleft(reversed(batch))
        served, t0 = 0, time.perf_counter()
        self._busy_counted = False  # the batch is counted in the stats once a row starts
        while self._pending and not self._stopping:
            self._wait_for_updates()
            adapter = self._group_adapter()
            if adapter is _NONE_LEFT:
                break
            served += self._serve_group(adapter)
        if served:
            self._record_busy(served, time.perf_counter() - t0)

    def _group_adapter(self) -> Any:
        """The adapter of the oldest waiting request, dropping cancelled requests and failing those of
        unknown adapters on the way (``_NONE_LEFT`` when none is left)."""
        while self._pending:
            request, future = self._pending[0]
            if future.cancelled():
                self._pending.popleft()
                continue
            name = self._adapter_of(request)
            if name is not None and name not in self.adapters:
                self._pending.popleft()
                if future.set_running_or_notify_cancel():
                    future.set_exception(
                        KeyError(f"unknown adapter {name!r}: this engine serves {sorted(self.adapters)}")
                    )
                continue
            return name
        return _NONE_LEFT

    def _admit(self, adapter: str | None, room: int, first: bool) -> list[Item]:
        """Start up to ``room`` waiting requests of ``adapter``: at a group's start all of them, later only
        while no request of another adapter (nor a weight update, nor close) waits."""
        if room <= 0 or not self._pending:
            return []
        if not first and (self._stopping or self._updates_waiting):
            return []
        names = [self._adapter_of(r) for r, _ in self._pending]
        others = (n != adapter and not f.cancelled() for n, (_, f) in zip(names, self._pending, strict=True))
        if not first and any(others):
            return []
        started: list[Item] = []
        kept: list[Item] = []
        for name, (request, future) in zip(names, self._pending, strict=True):
            if len(started) < room and name == adapter:
                if future.set_running_or_notify_cancel():
                    started.append((request, future))
            elif not future.cancelled():
                kept.append((request, future))
        self._pending.clear()
        self._pending.extend(kept)
        return started

    def _serve_group(self, adapter: str | None) -> int:
        """Decode the rows of one adapter until none is left; returns how many requests it served."""
        import torch

        served = 0
        counters = DecodeCounters()
        batch: RowBatch | None = None
        joining: list[Item] = []
        with self.lock, torch.inference_mode(), self._autocast():
            was_training = self.model.training
            if was_training:
                self.model.eval()
            try:
                with self.using_adapter(adapter):
                    prefixes = PrefixCache(self.prefix_cache_size, self.prefix_cache_bytes)
                    batch = self._row_batch(adapter, prefixes, counters)
                    joining = self._admit(adapter, self.max_batch_size, first=True)
                    while joining or batch.rows:
                        for request, future in joining:
                            self._started(request, future, adapter)
                        served += len(joining)
                        before = len(batch.rows)
                        ended = batch.add(joining)
                        joining = []
                        for row in batch.rows[before:]:  # their progress, for running()
                            self._started(row.request, row.handle, adapter, row.tokens)
                        if batch.rows:
                            self._record_rows(len(batch.rows), not self._busy_counted)
                            self._busy_counted = True
                        self._finish(batch, ended)
                        self._finish(batch, batch.step())
                        self._flush(counters)
                        if not batch.rows:  # drained: new requests are collected afresh (window, expect)
                            break
                        self._take_waiting()
                        joining = self._admit(adapter, self.max_batch_size - len(batch.rows), first=False)
            except BaseException as exc:  # every row of the group gets the error; the loop goes on
                rows = [(r.request, r.handle) for r in (batch.rows if batch is not None else [])]
                for _request, future in [*rows, *joining]:
                    if not future.done():
                        future.set_exception(exc)
                self._forget([*rows, *joining])
            finally:
                self._flush(counters)
                if was_training:
                    self.model.train()
        return served

    def _finish(self, batch: RowBatch, rows: list[Row]) -> None:
        """Resolve the futures of ended rows (their results, or the error that ended them)."""
        for row in rows:
            future = row.handle
            if row.error is not None:
                future.set_exception(row.error)
            else:
                result = batch.result(row)
                self._record_result(row.request, result)
                future.set_result(result)
            self._forget([(row.request, future)])

    def _flush(self, counters: DecodeCounters) -> None:
        """Add the work counted since the last flush to the engine's stats."""
        self._record_work(counters)
        for name in counters.__dataclass_fields__:
            setattr(counters, name, 0)
