"""Continuous batching for the HF engine: between decoding steps, ended rows resolve their futures and
leave, waiting requests of the running adapter join (prefilled, a shared prompt once)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .batching import Item
from .hf_decode import DecodeCounters, Row, RowBatch
from .hf_kvcache import PrefixCache

if TYPE_CHECKING:
    from .hf import HFEngine

__all__ = ["serve_continuously"]


def serve_continuously(engine: HFEngine, batch: list[Item]) -> None:
    """Serve ``batch`` (the first requests, collected by the batching loop) and every request that
    arrives while rows are decoding, until no row is left; then the engine's loop collects the next
    requests as it collected these (its batch window, :meth:`~.BatchingEngine.expect`).

    Rows of one adapter decode at a time (a *group*, under ``engine.lock``): a group starts with every
    waiting request of the adapter of the oldest waiting request (up to ``max_batch_size``), and
    requests of that adapter arriving later join it while no request of another adapter waits; once
    one does, the group takes no more and drains, and the next group is that request's adapter. A
    weight update waiting for the lock (:meth:`HFEngine.update_weights`) stops admission the same way.
    The prefix cache lives as long as a group: the weights cannot change under it."""
    engine._pending.extendleft(reversed(batch))
    served, t0 = 0, time.perf_counter()
    engine._busy_counted = False  # the batch is counted in the stats once a row starts
    while engine._pending and not engine._stopping:
        engine._wait_for_updates()
        adapter = _group_adapter(engine)
        if adapter is _NONE_LEFT:
            break
        served += _serve_group(engine, adapter)
    if served:
        engine._record_busy(served, time.perf_counter() - t0)


_NONE_LEFT = object()


def _group_adapter(engine: HFEngine) -> Any:
    """The adapter of the oldest waiting request, dropping cancelled requests and failing those of
    unknown adapters on the way (``_NONE_LEFT`` when none is left)."""
    while engine._pending:
        request, future = engine._pending[0]
        if future.cancelled():
            engine._pending.popleft()
            continue
        name = engine._adapter_of(request)
        if name is not None and name not in engine.adapters:
            engine._pending.popleft()
            if future.set_running_or_notify_cancel():
                future.set_exception(
                    KeyError(f"unknown adapter {name!r}: this engine serves {sorted(engine.adapters)}")
                )
            continue
        return name
    return _NONE_LEFT


def _admit(engine: HFEngine, adapter: str | None, room: int, first: bool) -> list[Item]:
    """Start up to ``room`` waiting requests of ``adapter``: at a group's start all of them, later only
    while no request of another adapter (nor a weight update, nor close) waits."""
    if room <= 0 or not engine._pending:
        return []
    if not first and (engine._stopping or engine._updates_waiting):
        return []
    names = [engine._adapter_of(r) for r, _ in engine._pending]
    others = (n != adapter and not f.cancelled() for n, (_, f) in zip(names, engine._pending, strict=True))
    if not first and any(others):
        return []
    started: list[Item] = []
    kept: list[Item] = []
    for name, (request, future) in zip(names, engine._pending, strict=True):
        if len(started) < room and name == adapter:
            if future.set_running_or_notify_cancel():
                started.append((request, future))
        elif not future.cancelled():
            kept.append((request, future))
    engine._pending.clear()
    engine._pending.extend(kept)
    return started


def _serve_group(engine: HFEngine, adapter: str | None) -> int:
    """Decode the rows of one adapter until none is left; returns how many requests it served."""
    import torch

    served = 0
    counters = DecodeCounters()
    batch: RowBatch | None = None
    joining: list[Item] = []
    with engine.lock, torch.inference_mode(), engine._autocast():
        was_training = engine.model.training
        if was_training:
            engine.model.eval()
        try:
            with engine.using_adapter(adapter):
                prefixes = PrefixCache(engine.prefix_cache_size, engine.prefix_cache_bytes)
                batch = engine._row_batch(adapter, prefixes, counters)
                joining = _admit(engine, adapter, engine.max_batch_size, first=True)
                while joining or batch.rows:
                    for request, future in joining:
                        engine._started(request, future, adapter)
                    served += len(joining)
                    before = len(batch.rows)
                    ended = batch.add(joining)
                    joining = []
                    for row in batch.rows[before:]:  # their progress, for running()
                        engine._started(row.request, row.handle, adapter, row.tokens)
                    if batch.rows:
                        engine._record_rows(len(batch.rows), not engine._busy_counted)
                        engine._busy_counted = True
                    _finish(engine, batch, ended)
                    _finish(engine, batch, batch.step())
                    _flush(engine, counters)
                    if not batch.rows:  # drained: new requests are collected afresh (window, expect)
                        break
                    engine._take_waiting()
                    joining = _admit(engine, adapter, engine.max_batch_size - len(batch.rows), first=False)
        except BaseException as exc:  # every row of the group gets the error; the loop goes on
            rows = [(r.request, r.handle) for r in (batch.rows if batch is not None else [])]
            for _request, future in [*rows, *joining]:
                if not future.done():
                    future.set_exception(exc)
            engine._forget([*rows, *joining])
        finally:
            _flush(engine, counters)
            if was_training:
                engine.model.train()
    return served


def _finish(engine: HFEngine, batch: RowBatch, rows: list[Row]) -> None:
    """Resolve the futures of ended rows (their results, or the error that ended them)."""
    for row in rows:
        future = row.handle
        if row.error is not None:
            future.set_exception(row.error)
        else:
            result = batch.result(row)
            engine._record_result(row.request, result)
            future.set_result(result)
        engine._forget([(row.request, future)])


def _flush(engine: HFEngine, counters: DecodeCounters) -> None:
    """Add the work counted since the last flush to the engine's stats."""
    engine._record_work(counters)
    for name in counters.__dataclass_fields__:
        setattr(counters, name, 0)
