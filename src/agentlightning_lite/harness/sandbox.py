"""Running a process where the network holds nothing but loopback and one bridged port.

:func:`isolated_command` wraps a command in ``unshare --net --pid --fork --kill-child``: a new network
namespace (only ``lo``, brought up here) and a new PID namespace (when its first process ends, the
kernel ends every process left in it, daemons included). Inside, :func:`main` (run as
``python -m agentlightning_lite.harness.sandbox``) listens on ``127.0.0.1:PORT`` and forwards each
connection to a Unix socket, which :class:`Bridge` (in the caller's process, on the host's network)
connects to the server. So the process reaches exactly one address: the server's port.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

__all__ = ["Bridge", "isolated_command", "isolation_available", "loopback_only", "main", "socket_path"]

_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def isolation_available() -> str | None:
    """``None`` when :func:`isolated_command` can run here, else why not (a sentence)."""
    if sys.platform != "linux":
        return "network namespaces need Linux"
    if shutil.which("unshare") is None:
        return "the unshare command (util-linux) is not installed"
    try:
        probe = subprocess.run(
            ["unshare", "--net", "--pid", "--fork", "--kill-child", "true"],
            capture_output=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    if probe.returncode != 0:
        err = probe.stderr.decode(errors="replace").strip()
        return f"unshare --net --pid cannot create namespaces here (root or user namespaces needed): {err}"
    return None


def socket_path() -> str:
    """A fresh path for a :class:`Bridge` socket, short enough for ``AF_UNIX`` (108 bytes); the
    bridge removes its folder when closed."""
    base = tempfile.gettempdir()
    if len(base) > 60:
        base = "/tmp"
    return os.path.join(tempfile.mkdtemp(prefix="agl-", dir=base), "s")


def isolated_command(command: Sequence[str], socket_path: str | Path, port: int) -> list[str]:
    """``command`` run in fresh network and PID namespaces, with ``127.0.0.1:port`` inside forwarded
    to the Unix socket ``socket_path`` (a :class:`Bridge`)."""
    return [
        "unshare",
        "--net",
        "--pid",
        "--fork",
        "--kill-child",
        sys.executable,
        "-c",
        _BOOT.format(root=str(Path(__file__).resolve().parents[2])),
        str(socket_path),
        str(port),
        "--",
        *command,
    ]


# runs this module's main() with this package first on sys.path (whatever the child's PYTHONPATH)
_BOOT = (
    "import sys; sys.path.insert(0, {root!r}); "
    "from agentlightning_lite.harness.sandbox import main; sys.exit(main())"
)


def interfaces() -> list[str]:
    """The network interfaces of this process's network namespace (``/proc/self/net/dev``)."""
    lines = Path("/proc/self/net/dev").read_text().splitlines()[2:]
    return [line.split(":", 1)[0].strip() for line in lines if ":" in line]


def loopback_only() -> bool:
    """Whether this process's network namespace has no interface but ``lo``."""
    return interfaces() == ["lo"]


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until both sides are done, then close both."""
    other = threading.Thread(target=_pipe, args=(b, a), daemon=True)
    other.start()
    _pipe(a, b)
    other.join()
    a.close()
    b.close()


class Bridge:
    """A Unix socket whose every connection is forwarded to ``host:port`` (a thread per connection).

    The sandboxed side (:func:`main`) connects here; nothing else is reachable from the namespace.

    >>> import tempfile, os
    >>> with Bridge(os.path.join(tempfile.mkdtemp(), "s"), "127.0.0.1", 9) as b:
    ...     os.path.exists(b.path)
    True
    """

    def __init__(self, path: str | Path, host: str, port: int) -> None:
        self.path = str(path)
        self.host, self.port = host, port
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        os.chmod(self.path, 0o600)
        self._sock.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="agl-harness-bridge", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._forward, args=(conn,), daemon=True).start()

    def _forward(self, conn: socket.socket) -> None:
        try:
            upstream = socket.create_connection((self.host, self.port), timeout=30)
            upstream.settimeout(None)
        except OSError:
            conn.close()
            return
        _splice(conn, upstream)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        folder = os.path.dirname(self.path)
        if os.path.basename(folder).startswith("agl-"):  # made by socket_path()
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def __enter__(self) -> Bridge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Inside the namespaces: bring ``lo`` up, refuse to go on if any other interface exists, forward
    ``127.0.0.1:PORT`` to the Unix socket, run the command and exit with its status.

    Usage: ``python -m agentlightning_lite.harness.sandbox SOCKET PORT -- COMMAND...``
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 4 or args[2] != "--":
        print(
            "usage: python -m agentlightning_lite.harness.sandbox SOCKET PORT -- COMMAND...", file=sys.stderr
        )
        return 2
    socket_path, port, command = args[0], int(args[1]), args[3:]
    _loopback_up()
    if not loopback_only():
        print(f"agl sandbox: refusing to run, interfaces besides lo: {interfaces()}", file=sys.stderr)
        return 125
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                up.connect(socket_path)
            except OSError:
                conn.close()
                up.close()
                continue
            threading.Thread(target=_splice, args=(conn, up), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"agl sandbox: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127

    def forward(signum: int, frame: object) -> None:  # PID 1 gets only the signals it handles
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
