"""Serve the web view with uvicorn, in the foreground (``agl-lite ui``) or a background thread (tests).

The thread, socket and shutdown are :class:`~agentlightning_lite.serving.threaded.ThreadedUvicorn`'s.
"""

from __future__ import annotations

import logging

from ..serving.threaded import ThreadedUvicorn
from .app import make_app
from .data import RunData

__all__ = ["UIServer"]

logger = logging.getLogger(__name__)


class UIServer(ThreadedUvicorn):
    """The web view of ``data`` at ``http://host:port`` (``port=0`` picks a free one).

    Binding anywhere but the loopback needs an ``api_key`` (the store's prompts and replies are in it).

    >>> import os, tempfile, agentlightning_lite as agl
    >>> store = agl.SQLiteStore(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> UIServer(RunData(store), host="0.0.0.0")
    Traceback (most recent call last):
    ...
    ValueError: binding 0.0.0.0 (not the loopback) needs an API key: pass api_key= (agl-lite ui --api-key)
    """

    _label = "web view"
    _thread_name = "agl-ui"

    def __init__(
        self,
        data: RunData,
        host: str = "127.0.0.1",
        port: int = 0,
        api_key: str | None = None,
        log_level: str = "warning",
    ) -> None:
        api_key = api_key or None  # an empty key (AGL_API_KEY="") is no key
        if api_key is None and not _loopback(host):
            raise ValueError(
                f"binding {host} (not the loopback) needs an API key: pass api_key= (agl-lite ui --api-key)"
            )
        super().__init__(host, port, log_level)
        self.data = data
        self.api_key = api_key
        self.app = make_app(data, api_key)


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
