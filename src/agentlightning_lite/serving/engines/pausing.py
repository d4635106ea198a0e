"""Pausing an engine for a weight switch: new requests wait, the ones in flight finish first.

:class:`Pausable` is the contract: :meth:`~Pausable.pause` holds the requests that arrive from then on
(their futures are returned at once and start when the engine resumes) and returns once no request is
generating; :meth:`~Pausable.resume` sends the held ones on; :meth:`~Pausable.paused` is both as a
context manager. Pauses nest (the engine resumes at the last ``resume``). A held request can be
cancelled like any other (``engine.cancel(future)``).

:class:`PauseGate` is the shared logic, an ordinary object an engine holds and calls:
:class:`~.base.Engine` implements ``pause``/``resume``/``paused`` with it, and its ``submit`` and
``cancel`` pass through it to ``start_request`` and ``cancel_request``, the two methods an engine
implements to start and stop one request. So every engine pauses, and an engine's own code runs only
for requests the gate lets through.

>>> from agentlightning_lite.serving.engines import GenRequest, ScriptedEngine
>>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
>>> isinstance(engine, Pausable)
True
>>> engine.pause()
>>> held = engine.submit(GenRequest(prompt_token_ids=[1]))
>>> held.done()  # waits for the resume
False
>>> engine.resume()
>>> held.result(5).text
'hi'
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

__all__ = ["Pausable", "PauseGate"]

Future = concurrent.futures.Future
#: how a gate starts one request the engine takes now: ``start(request) -> future``
Start = Callable[[Any], "concurrent.futures.Future[Any]"]


@runtime_checkable
class Pausable(Protocol):
    """What an engine that can be paused for a weight switch implements (every :class:`~.base.Engine`)."""

    def pause(self) -> None:
        """Hold new requests; return once no request is in flight (the weights may then switch)."""

    def resume(self) -> None:
        """End a :meth:`pause`: the held requests go on (at the last of nested pauses)."""

    def paused(self) -> AbstractContextManager[None]:
        """``pause()`` ... ``resume()`` as a context: no request generates inside."""


class PauseGate:
    """One engine's pause: how many pauses are open, the requests in flight and those held.

    The engine routes each request through :meth:`submit` (with the function that starts it) and each
    cancellation through :meth:`cancel`; :meth:`pause`, :meth:`resume` and :meth:`paused` are the
    engine's own.

    >>> import concurrent.futures
    >>> def start(request):
    ...     done = concurrent.futures.Future()
    ...     done.set_result(request * 2)
    ...     return done
    >>> gate = PauseGate()
    >>> with gate.paused():
    ...     held = gate.submit(21, start)
    ...     held.done()
    False
    >>> held.result(5)
    42
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pauses = 0
        self.in_flight = 0
        #: requests that arrived while paused: (request, the future handed out, how to start it)
        self.held: list[tuple[Any, Future[Any], Start]] = []
        #: a held request's future -> the future of the request once started (to cancel it there)
        self.forward: dict[Future[Any], Future[Any]] = {}

    def submit(self, request: Any, start: Start) -> Future[Any]:
        """``start(request)`` now, counted in flight until its future is done; while paused, a future
        held until :meth:`resume` instead."""
        with self.cond:
            if self.pauses:
                held: Future[Any] = Future()
                self.held.append((request, held, start))
                return held
            self.in_flight += 1
        try:
            future = start(request)
        except BaseException:
            self.finished()
            raise
        future.add_done_callback(self.finished)
        return future

    def cancel(self, future: Future[Any], cancel: Callable[[Future[Any]], bool]) -> bool:
        """Drop ``future`` if it is held; else ``cancel`` it (or the request it was passed on to)."""
        with self.cond:
            for i, (_request, held, _start) in enumerate(self.held):
                if held is future:
                    del self.held[i]
                    return future.cancel()
            inner = self.forward.get(future)
        return cancel(inner if inner is not None else future)

    def finished(self, _future: object = None) -> None:
        """Count one request out of flight."""
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()

    def pause(self) -> None:
        """Hold new requests; return once no request is in flight."""
        with self.cond:
            self.pauses += 1
            self.cond.wait_for(lambda: self.in_flight == 0)

    def resume(self) -> None:
        """End a :meth:`pause`: the held requests go on (at the last of nested pauses)."""
        with self.cond:
            if self.pauses == 0:
                raise RuntimeError("resume() without pause()")
            self.pauses -= 1
            if self.pauses:
                return
            held, self.held = self.held, []
        for request, outer, start in held:
            if outer.set_running_or_notify_cancel():
                self.pass_on(request, outer, start)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """:meth:`pause` ... :meth:`resume` as a context (resumed on an error too)."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def pass_on(self, request: Any, outer: Future[Any], start: Start) -> None:
        """Submit a held request again (held anew if another pause began meanwhile); its result, error
        or cancellation reaches ``outer``, the future its caller holds."""
        try:
            inner = self.submit(request, start)
        except BaseException as exc:  # the request's caller gets it
            outer.set_exception(exc)
            return
        with self.cond:
            self.forward[outer] = inner

        def copy(f: Future[Any]) -> None:
            with self.cond:
                self.forward.pop(outer, None)
            if f.cancelled():
                outer.set_exception(concurrent.futures.CancelledError())
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(copy)
