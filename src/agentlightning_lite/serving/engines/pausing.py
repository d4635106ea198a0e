"""Pausing an engine for a weight switch: new requests wait, the ones in flight finish first.

Every :class:`~.base.Engine` is :class:`Pausable`: :meth:`~Pausable.pause` holds the requests that
arrive from then on (their futures are returned at once and start when the engine resumes) and returns
once no request is generating; :meth:`~Pausable.resume` sends the held ones on; :meth:`~Pausable.paused`
is both as a context manager. Pauses nest (the engine resumes at the last ``resume``). A held request
can be cancelled like any other (``engine.cancel(future)``). The mixin routes each subclass's own
``submit`` and ``cancel`` through the pause when the subclass is defined, so an engine gets it without
writing anything.

>>> from agentlightning_lite.serving.engines import GenRequest, ScriptedEngine
>>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
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
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Pausable"]

_MAKE_STATE = threading.Lock()


class _PauseState:
    """One engine's pause: how many pauses are open, the requests in flight and held."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.pauses = 0
        self.in_flight = 0
        self.held: list[tuple[Any, concurrent.futures.Future[Any]]] = []
        self.forward: dict[concurrent.futures.Future[Any], concurrent.futures.Future[Any]] = {}
        self.local = threading.local()  # ``inside``: a gated submit runs in this thread (super() calls)

    def finished(self, _future: object = None) -> None:
        with self.cond:
            self.in_flight -= 1
            self.cond.notify_all()


def _state(engine: object) -> _PauseState:
    state = engine.__dict__.get("_pause_state")
    if state is None:
        with _MAKE_STATE:
            state = engine.__dict__.setdefault("_pause_state", _PauseState())
    return state


def _gated_submit(submit: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(submit)
    def gated(self: Any, request: Any) -> concurrent.futures.Future[Any]:
        state = _state(self)
        if getattr(state.local, "inside", False):  # a subclass's submit calling its parent's
            return submit(self, request)
        with state.cond:
            if state.pauses:
                held: concurrent.futures.Future[Any] = concurrent.futures.Future()
                state.held.append((request, held))
                return held
            state.in_flight += 1
        state.local.inside = True
        try:
            future = submit(self, request)
        except BaseException:
            state.finished()
            raise
        finally:
            state.local.inside = False
        future.add_done_callback(state.finished)
        return future

    gated.__agl_gated__ = True  # type: ignore[attr-defined]
    return gated


def _gated_cancel(cancel: Callable[..., bool]) -> Callable[..., bool]:
    @functools.wraps(cancel)
    def gated(self: Any, future: concurrent.futures.Future[Any]) -> bool:
        state = _state(self)
        with state.cond:
            for i, (_request, held) in enumerate(state.held):
                if held is future:
                    del state.held[i]
                    return future.cancel()
            inner = state.forward.get(future)
        return cancel(self, inner if inner is not None else future)

    gated.__agl_gated__ = True  # type: ignore[attr-defined]
    return gated


class Pausable:
    """``pause()``, ``resume()`` and ``paused()`` of every engine (see the module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, gate in (("submit", _gated_submit), ("cancel", _gated_cancel)):
            own = cls.__dict__.get(name)
            if callable(own) and not getattr(own, "__agl_gated__", False):
                setattr(cls, name, gate(own))

    def pause(self) -> None:
        """Hold new requests; return once no request is in flight (the weights may then switch)."""
        state = _state(self)
        with state.cond:
            state.pauses += 1
            state.cond.wait_for(lambda: state.in_flight == 0)

    def resume(self) -> None:
        """End a :meth:`pause`: the held requests go on (at the last of nested pauses)."""
        state = _state(self)
        with state.cond:
            if state.pauses == 0:
                raise RuntimeError("resume() without pause()")
            state.pauses -= 1
            if state.pauses:
                return
            held, state.held = state.held, []
        for request, outer in held:
            if outer.set_running_or_notify_cancel():
                self._pass_on(state, request, outer)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No request generates inside: new ones wait, the ones in flight finish first.

        >>> from agentlightning_lite.serving.engines import ScriptedEngine
        >>> engine = ScriptedEngine(["hi"], tokenizer="bytes")
        >>> with engine.paused():
        ...     pass  # switch the weights here
        """
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def _pass_on(self, state: _PauseState, request: Any, outer: concurrent.futures.Future[Any]) -> None:
        try:
            inner = type(self).submit(self, request)  # type: ignore[attr-defined]  # (the class's: gated once)
        except BaseException as exc:  # the request's caller gets it
            outer.set_exception(exc)
            return
        with state.cond:
            state.forward[outer] = inner

        def copy(f: concurrent.futures.Future[Any]) -> None:
            with state.cond:
                state.forward.pop(outer, None)
            if f.cancelled():
                outer.set_exception(concurrent.futures.CancelledError())
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(copy)
