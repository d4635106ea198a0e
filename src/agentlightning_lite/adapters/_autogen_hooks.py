"""The AutoGen adapter's hooks: the adapter span open in each context, the loggers tapped for its event
handlers, and the wrappers it installs on AutoGen's agent and team classes (each removable in any order)."""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._common import Recorder

if TYPE_CHECKING:
    from .autogen import LightningEventHandler

#: the key of the adapter span (agent turn or team run) open in this context
current_key: contextvars.ContextVar[Any] = contextvars.ContextVar("agl_autogen_span", default=None)


#: id(span key) -> (recorder, parent key) of an open instrument() span
_handlers_by_key: dict[int, tuple[Recorder, Any]] = {}


def handler_recorder(key: Any) -> Recorder | None:
    entry = None if key is None else _handlers_by_key.get(id(key))
    return None if entry is None else entry[0]


def own_key(recorder: Recorder, key: Any) -> Any:
    """The innermost open span of ``recorder`` among ``key`` and its ancestors (``None``: none):
    with several instrumentations active, each nests its spans under its own."""
    while key is not None:
        entry = _handlers_by_key.get(id(key))
        if entry is None:
            return None
        if entry[0] is recorder:
            return key
        key = entry[1]
    return None


class _LevelTap(logging.Filter):
    """On a logger whose level was lowered for us: every record goes to the active instrumentations'
    handlers, and on to the logger's own handlers only at the old level (records below it reach this
    adapter and nobody else). One per logger, shared by every :func:`instrument` that is active, so
    that each of them sees every event and the level comes back when the last one is removed,
    whatever the order they are removed in."""

    def __init__(self, old_effective: int, old_level: int) -> None:
        super().__init__()
        self.handlers: list[LightningEventHandler] = []
        self.old_effective = old_effective
        self.old_level = old_level

    def filter(self, record: logging.LogRecord) -> bool:
        for handler in list(self.handlers):
            handler.emit(record)
        return record.levelno >= self.old_effective


hooks_lock = threading.Lock()


def tap_logger(logger_name: str, handler: LightningEventHandler) -> Callable[[], None]:
    """Give ``handler`` the records of ``logger_name`` (see :class:`_LevelTap`); returns its removal."""
    lg = logging.getLogger(logger_name)
    with hooks_lock:
        tap = next((f for f in lg.filters if isinstance(f, _LevelTap)), None)
        if tap is None:
            tap = _LevelTap(lg.getEffectiveLevel(), lg.level)
            lg.addFilter(tap)
            if lg.getEffectiveLevel() > logging.DEBUG:
                lg.setLevel(logging.DEBUG)
        tap.handlers.append(handler)

    def release() -> None:
        with hooks_lock:
            if handler in tap.handlers:
                tap.handlers.remove(handler)
            if not tap.handlers and tap in lg.filters:
                lg.removeFilter(tap)
                lg.setLevel(tap.old_level)

    return release


def patch_method(cls: type, attr: str, wrapper: Any) -> Callable[[], None]:
    """Install ``wrapper`` (made from ``cls.attr``) on ``cls``; returns its removal, which works in any
    order: a wrapper that another was installed over becomes a pass-through (its ``agl_live`` is
    false) and comes off the class once the ones above it have."""
    wrapper.agl_original = cls.__dict__[attr]
    wrapper.agl_live = True
    setattr(cls, attr, wrapper)

    def unpatch() -> None:
        with hooks_lock:
            wrapper.agl_live = False
            top: Any = cls.__dict__.get(attr)
            while getattr(top, "agl_live", None) is False:  # dead wrappers on top come off
                top = top.agl_original
                setattr(cls, attr, top)

    return unpatch


def wrap_coroutine(
    fn: Callable[..., Any], recorder: Recorder, kind: str, name_of: Callable[[Any], str]
) -> Any:
    @functools.wraps(fn)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not getattr(wrapper, "agl_live", True):  # removed while another wraps it: a pass-through
            return await fn(self, *args, **kwargs)
        name = name_of(self)
        key = object()
        current = current_key.get()
        parent = own_key(recorder, current)  # its own innermost span (keys in current_key are registered)
        h = recorder.start(key, kind, name, parent_key=parent, agent=name if kind == "agent" else None)
        if h is None:
            return await fn(self, *args, **kwargs)
        _handlers_by_key[id(key)] = (recorder, current)
        token = current_key.set(key)
        try:
            result = await fn(self, *args, **kwargs)
        except BaseException as exc:
            recorder.end(key, error=exc)
            raise
        else:
            recorder.end(key)
            return result
        finally:
            current_key.reset(token)
            _handlers_by_key.pop(id(key), None)

    return wrapper


def wrap_stream(fn: Callable[..., Any], recorder: Recorder, kind: str, name_of: Callable[[Any], str]) -> Any:
    @functools.wraps(fn)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        h = None
        if getattr(wrapper, "agl_live", True):  # else removed while another wraps it: a pass-through
            name = name_of(self)
            key = object()
            current = current_key.get()
            parent = own_key(recorder, current)  # its own innermost span (keys in current_key are registered)
            h = recorder.start(key, kind, name, parent_key=parent, agent=name if kind == "agent" else None)
        if h is None:
            async for item in fn(self, *args, **kwargs):
                yield item
            return
        _handlers_by_key[id(key)] = (recorder, current)
        token = current_key.set(key)
        try:
            async for item in fn(self, *args, **kwargs):
                yield item
        except BaseException as exc:
            recorder.end(key, error=exc)
            raise
        else:
            recorder.end(key)
        finally:
            try:
                current_key.reset(token)
            except ValueError:  # the consumer iterated us from another context
                pass
            _handlers_by_key.pop(id(key), None)

    return wrapper
