"""MCP adapter: every tool call an agent makes to an MCP server, recorded as a ``tool`` span.

:func:`instrument` wraps the ``mcp`` client SDK's ``ClientSession.call_tool`` (and, in mcp 2.x, the
high-level ``mcp.Client.call_tool``) once. A plain ``mcp`` client, the OpenAI Agents SDK's MCP servers
(``agents.mcp.MCPServerStdio`` and the others), LangChain's MCP adapters and AutoGen's ``McpWorkbench``
all call tools through it. A call whose framework ``tool`` span is already open (a framework adapter
records it) completes that span instead of recording a second one.
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
import threading
import warnings
from collections.abc import Callable
from typing import Any

from mcp.client.session import ClientSession

from .._json import to_jsonable
from ..store.base import Store
from ..tracer import SpanHandle, Tracer
from . import _tool_claims
from ._common import Installed, Instrumentation, as_tracer

__all__ = ["SOURCE", "instrument", "is_error", "result_output", "uninstrument"]

logger = logging.getLogger(__name__)

#: the ``agl.source`` of the spans this adapter records
SOURCE = "mcp"

#: set while a wrapped call runs: a call made inside it (a session call under ``Client.call_tool``) is its own
_inside: contextvars.ContextVar[bool] = contextvars.ContextVar("agl_mcp_inside", default=False)

_lock = threading.Lock()
_destinations: list[Tracer | None] = []  # one per active instrument(); None: the rollout open at the call
_originals: dict[type, Callable[..., Any]] = {}  # class -> the call_tool it had before ours
_warned = False


def _field(obj: Any, *names: str) -> Any:
    """The first of ``names`` that ``obj`` has (mcp 2.x ``is_error``, mcp 1.x ``isError``)."""
    for name in names:
        if hasattr(obj, name):
            return getattr(obj, name)
    return None


def is_error(result: Any) -> bool:
    """Whether an MCP tool result says the tool failed (its ``isError`` flag; ``is_error`` in mcp 2.x).

    >>> from types import SimpleNamespace as R
    >>> is_error(R(is_error=True)), is_error(R(isError=False)), is_error(R())
    (True, False, False)
    """
    return bool(_field(result, "is_error", "isError"))


def _text(result: Any) -> str | None:
    texts = [getattr(c, "text", None) for c in _field(result, "content") or ()]
    joined = "\n".join(t for t in texts if isinstance(t, str))
    return joined or None


def result_output(result: Any) -> Any:
    """What a tool span records as an MCP result's output: its structured content when the tool succeeded
    and has some, else its text (the text blocks joined), else its content blocks as JSON.

    >>> from types import SimpleNamespace as R
    >>> text = R(type="text", text="Error: division by zero")
    >>> result_output(R(content=[text], structured_content=None, is_error=True))
    'Error: division by zero'
    >>> result_output(R(content=[R(type="text", text="5")], structured_content={"result": 5}, is_error=False))
    {'result': 5}
    """
    structured = _field(result, "structured_content", "structuredContent")
    if structured is not None and not is_error(result):
        return to_jsonable(structured)
    content = _field(result, "content")
    if content is None:  # not a tool result (an input-required or extension result): recorded as it is
        return to_jsonable(result)
    text = _text(result)
    if text is not None and all(getattr(c, "type", None) == "text" for c in content):
        return text
    return to_jsonable(list(content))


def _server_name(client: Any) -> str | None:
    for obj in (client, getattr(client, "session", None)):
        try:
            info = getattr(obj, "server_info", None)  # mcp 2.x; mcp 1.x keeps no server info on the session
        except Exception:  # not initialised yet
            info = None
        name = getattr(info, "name", None)
        if isinstance(name, str) and name:
            return name
    return None


class _Call:
    """One tool call being recorded: its own spans, and the framework span it completes, if any."""

    def __init__(self, client: Any, name: str, arguments: Any) -> None:
        global _warned
        self.name = name
        current = Tracer.current_rollout()
        self.claimed = _tool_claims.claim(name, current.id if current is not None else None)
        server = _server_name(client)
        self.attrs: dict[str, Any] = {"mcp.server": server} if server else {}
        self.spans: list[SpanHandle] = []
        with _lock:
            destinations = list(_destinations)
        seen: set[tuple[int, str | None]] = set()
        for dest in destinations:
            target = _target(dest, current)
            if target is None:
                continue
            tracer, rollout_id = target
            if self.claimed is not None and tracer.store is self.claimed.store:
                continue  # the framework's span records this call in that store
            if (id(tracer.store), rollout_id) in seen:
                continue
            seen.add((id(tracer.store), rollout_id))
            attrs = {"agl.source": SOURCE, **self.attrs}
            self.spans.append(
                tracer.start_span(
                    "tool", name, input=to_jsonable(arguments), attributes=attrs, rollout_id=rollout_id
                )
            )
        if self.claimed is None and not self.spans and not _warned:
            _warned = True
            warnings.warn(
                "agentlightning_lite mcp adapter: no rollout is open and no tracer was given, so MCP tool "
                "calls are not recorded (open one with `with tracer.rollout(...)`)",
                RuntimeWarning,
                stacklevel=4,
            )

    def done(self, result: Any) -> None:
        failed = is_error(result)
        message = (_text(result) or f"MCP tool {self.name} returned an error") if failed else None
        output = result_output(result)
        for h in self.spans:
            h.attributes["mcp.is_error"] = failed
            h.end(output=output, error=message)
        self._complete(failed, message)

    def fail(self, exc: BaseException) -> None:
        for h in self.spans:
            h.end(error=exc)
        self._complete(True, exc)

    def _complete(self, failed: bool, error: BaseException | str | None) -> None:
        claimed = self.claimed
        if claimed is None:
            return
        h = claimed.handle
        h.attributes.update({**self.attrs, "mcp.is_error": failed, "mcp.calls": claimed.calls})
        if failed and error is not None:
            h.set_error(error)
            claimed.failed = True
        elif claimed.failed:  # a retry succeeded where an earlier call of this span failed
            h.status, h.error, claimed.failed = "ok", None, False
        _tool_claims.release(claimed)


def _target(dest: Tracer | None, current: Any) -> tuple[Tracer, str | None] | None:
    """Where a destination records a call: the rollout open here (of its store), or an implicit one."""
    if dest is None:
        return None if current is None else (current.tracer, current.id)
    if current is not None and current.tracer.store is dest.store:
        return dest, current.id
    return dest, None


def _begin(client: Any, name: Any, arguments: Any) -> _Call | None:
    try:
        return _Call(client, str(name), arguments)
    except Exception:  # the agent's call must not fail because of tracing
        logger.exception("agentlightning_lite: recording MCP tool call %r failed", name)
        return None


def _finish(call: _Call | None, result: Any = None, exc: BaseException | None = None) -> None:
    if call is None:
        return
    try:
        if exc is not None:
            call.fail(exc)
        else:
            call.done(result)
    except Exception:
        logger.exception("agentlightning_lite: recording MCP tool call %r failed", call.name)


def _wrap(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def call_tool(self: Any, name: str, arguments: Any = None, *args: Any, **kwargs: Any) -> Any:
        if not _destinations or _inside.get():
            return await original(self, name, arguments, *args, **kwargs)
        token = _inside.set(True)
        try:
            call = _begin(self, name, arguments)
            try:
                result = await original(self, name, arguments, *args, **kwargs)
            except BaseException as exc:  # cancelled calls too: the agent did not get a result
                _finish(call, exc=exc)
                raise
            _finish(call, result)
            return result
        finally:
            _inside.reset(token)

    call_tool.__agl_wrapped__ = original  # type: ignore[attr-defined]
    return call_tool


def _classes() -> list[type]:
    """``ClientSession``, and mcp 2.x's high-level ``mcp.Client`` (whose ``call_tool`` may make several
    session calls: input rounds, a retry) so that its call is one span."""
    try:
        high_level = getattr(importlib.import_module("mcp.client.client"), "Client", None)
    except ImportError:  # mcp 1.x has none
        high_level = None
    return [ClientSession] + ([high_level] if isinstance(high_level, type) else [])


def _patch() -> None:
    for cls in _classes():
        if cls not in _originals:
            current = cls.__dict__["call_tool"]
            _originals[cls] = current
            setattr(cls, "call_tool", _wrap(current))  # noqa: B010


def _unpatch() -> None:
    for cls, original in list(_originals.items()):
        if getattr(cls.__dict__.get("call_tool"), "__agl_wrapped__", None) is original:
            setattr(cls, "call_tool", original)  # noqa: B010
            del _originals[cls]
        # else another library wrapped ours since: ours stays under it, recording nothing when no
        # instrumentation is active, and is not wrapped a second time by the next instrument()


_installed = Installed(SOURCE)


def instrument(tracer: Tracer | Store | None = None) -> Instrumentation:
    """Record every MCP tool call of this process as a ``tool`` span: the tool's name, the arguments, the
    result (structured content, else text) and errors (an ``isError`` result and an exception both fail it).

    With no ``tracer``, a call is recorded into the rollout open where it is made (nothing, with one
    warning after each ``instrument()``, when none is); with one, into its store (an implicit rollout
    when none of its is open).
    ``ClientSession.call_tool`` is wrapped once however often this is called, and a call is recorded once
    per destination; ``handle.uninstrument()`` (or :func:`uninstrument`) removes the destination, and the
    wrapper with the last one. A framework adapter's ``tool`` span open for the same call (LangChain, the
    Agents SDK, AutoGen) gets the MCP outcome (its ``isError`` fails it) instead of a second span.

    >>> from mcp import ClientSession
    >>> from agentlightning_lite.adapters import mcp as agl_mcp
    >>> with agl_mcp.instrument() as handle:
    ...     hasattr(ClientSession.call_tool, "__agl_wrapped__")
    True
    >>> hasattr(ClientSession.call_tool, "__agl_wrapped__")
    False
    """
    global _warned
    dest = as_tracer(tracer)
    with _lock:
        _warned = False  # each instrumentation warns (once) when it has nowhere to record
        _destinations.append(dest)
        _patch()

    def undo() -> None:
        with _lock:
            for i, d in enumerate(_destinations):
                if d is dest:
                    del _destinations[i]
                    break
            if not _destinations:
                _unpatch()

    return _installed.add(dest, undo)


#: Remove every instrumentation :func:`instrument` installed and has not removed, the latest first.
uninstrument = _installed.uninstrument
