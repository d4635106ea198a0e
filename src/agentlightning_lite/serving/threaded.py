"""A uvicorn server run in a background thread of this process (the PolicyServer and the web view).

A subclass sets :attr:`ThreadedUvicorn.app` (an ASGI app) and the class attributes naming it; it may
add uvicorn options (:meth:`ThreadedUvicorn._config_options`) and act once serving
(:meth:`ThreadedUvicorn._on_started`).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any, TypeVar

__all__ = ["ThreadedUvicorn"]

_S = TypeVar("_S", bound="ThreadedUvicorn")


class ThreadedUvicorn:
    """``start()``/``stop()`` (or ``with``) a uvicorn server in a daemon thread (``port=0``: a free port)."""

    #: what messages call the server ("the PolicyServer did not start within 30 s")
    _label = "server"
    _thread_name = "agl-server"
    _backlog = 128
    app: Any

    def __init__(self, host: str, port: int, log_level: str) -> None:
        self.host = host
        self._requested_port = int(port)
        self.log_level = log_level
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The port the server listens on (known once started)."""
        if self._port is None:
            raise RuntimeError(f"the {self._label} is not started")
        return self._port

    @property
    def url(self) -> str:
        """``http://host:port`` (no path)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def uvicorn_config(self) -> Any:
        """The running uvicorn server's ``Config`` (its event loop, limits...); ``None`` before ``start``."""
        return None if self._server is None else self._server.config

    @property
    def running(self) -> bool:
        """Whether the server thread is serving."""
        return self._thread is not None and self._thread.is_alive()

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        # proto=IPPROTO_TCP, not 0: the accepted sockets inherit it, and plain asyncio sets
        # TCP_NODELAY only on sockets whose proto says TCP. Without it every response waited for the
        # client's delayed ACK (about 40 ms) unless uvloop served. The listener's flag is inherited too.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self.host, self._requested_port))
        except OSError as exc:
            sock.close()
            raise OSError(f"cannot listen on {self.host}:{self._requested_port}: {exc}") from exc
        sock.listen(self._backlog)
        sock.set_inheritable(True)
        return sock

    def _config_options(self) -> dict[str, Any]:
        """uvicorn options beyond the log level, no access log and no lifespan."""
        return {}

    def _make_server(self) -> Any:
        import uvicorn

        config = uvicorn.Config(
            self.app, log_level=self.log_level, access_log=False, lifespan="off", **self._config_options()
        )
        return uvicorn.Server(config)

    def _on_started(self) -> None:
        """Called once a ``start()`` has the server accepting connections."""

    def start(self: _S, timeout: float = 30.0) -> _S:
        """Start serving in a background thread; returns once the port accepts connections."""
        if self.running:
            return self
        self._socket = self._bind()
        self._port = self._socket.getsockname()[1]
        self._server = self._make_server()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=self._thread_name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the {self._label} thread stopped while starting (see the log above)")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the {self._label} did not start within {timeout} s")
            time.sleep(0.01)
        self._on_started()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving (open connections get ``timeout`` seconds to finish)."""
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
        """Serve in the foreground until Ctrl-C or SIGTERM."""
        import signal

        def _term(signum: int, frame: Any) -> None:
            raise KeyboardInterrupt

        previous = signal.signal(signal.SIGTERM, _term)
        self.start()
        try:
            while (thread := self._thread) is not None and thread.is_alive():
                thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.stop()

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
