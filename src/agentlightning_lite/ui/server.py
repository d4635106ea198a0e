"""Serve the web view with uvicorn, in the foreground (``agl-lite ui``) or a background thread (tests)."""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any

from .app import make_app
from .data import RunData

__all__ = ["UIServer"]

logger = logging.getLogger(__name__)


class UIServer:
    """The web view of ``data`` at ``http://host:port`` (``port=0`` picks a free one).

    Binding anywhere but the loopback needs an ``api_key`` (the store's prompts and replies are in it).

    >>> import os, tempfile, agentlightning_lite as agl
    >>> store = agl.SQLiteStore(os.path.join(tempfile.mkdtemp(), "runs.db"))
    >>> UIServer(RunData(store), host="0.0.0.0")
    Traceback (most recent call last):
    ...
    ValueError: binding 0.0.0.0 (not the loopback) needs an API key: pass api_key= (agl-lite ui --api-key)
    """

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
        self.data = data
        self.host = host
        self._requested_port = int(port)
        self.api_key = api_key
        self.log_level = log_level
        self.app = make_app(data, api_key)
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the UIServer is not started")
        return self._port

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def start(self, timeout: float = 30.0) -> UIServer:
        """Serve in a background thread; returns once the port accepts connections."""
        import uvicorn

        if self._thread is not None and self._thread.is_alive():
            return self
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {self.host}:{self._requested_port}: {exc}") from exc
        sock.listen(128)
        self._socket = sock
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="agl-ui", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the web view's server stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the web view did not start within {timeout} s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive() and self._server is not None:
                self._server.force_exit = True
                self._thread.join(timeout)
        self._thread = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def serve_forever(self) -> None:
        """Serve until Ctrl-C or SIGTERM."""
        import signal

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _term)
        self.start()
        try:
            while self._thread is not None and self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self) -> UIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
