"""The CLI side of the control socket: one blocking request, one reply.

``call(path, request, timeout=...) -> dict`` sends one JSON line and reads one
JSON line back (protocol in ``qmgrd.daemon.control``). It raises
``DaemonNotRunning`` when nothing listens at ``path`` (no socket file, or a
stale one nobody accepts on), ``ControlError`` when the daemon answers
``{"ok": false}``, and ``QmgrdError`` for a daemon that does not answer in
time or answers garbage. The CLI is synchronous, so this is plain
``socket``: no event loop for a single round trip.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from qmgrd.daemon.control_socket import control_socket_path, unix_address
from qmgrd.errors import QmgrdError

__all__ = ["ControlError", "DaemonNotRunning", "call", "control_socket_path", "daemon_running"]

REPLY_LIMIT = 256 * 1024 * 1024  # a status reply with every destination of a big queue
DEFAULT_TIMEOUT = 60.0


class DaemonNotRunning(QmgrdError):
    """Nothing accepts connections on the control socket."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"the daemon is not running (no control socket at {path})")
        self.path = path


class ControlError(QmgrdError):
    """The daemon refused a request (its ``error`` text is the message)."""


def call(
    path: Path, request: Mapping[str, Any], *, timeout: float = DEFAULT_TIMEOUT
) -> dict[str, Any]:
    """Send ``request`` to the daemon at ``path`` and return its (successful) reply."""
    line = json.dumps(dict(request), separators=(",", ":")).encode("ascii") + b"\n"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            with unix_address(path) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise DaemonNotRunning(path) from exc
        except PermissionError as exc:
            raise QmgrdError(f"cannot connect to {path}: permission denied") from exc
        except OSError as exc:
            raise QmgrdError(f"cannot connect to {path}: {exc.strerror or exc}") from exc
        try:
            sock.sendall(line)
            data = _read_line(sock)
        except TimeoutError as exc:
            raise QmgrdError(f"the daemon did not answer within {timeout:g}s ({path})") from exc
        except OSError as exc:
            raise QmgrdError(f"control connection to {path} failed: {exc.strerror or exc}") from exc
    try:
        reply = json.loads(data)
    except ValueError as exc:
        raise QmgrdError(f"the daemon sent an unreadable reply on {path}") from exc
    if not isinstance(reply, dict) or "ok" not in reply:
        raise QmgrdError(f"the daemon sent an unexpected reply on {path}")
    if reply["ok"] is not True:
        raise ControlError(str(reply.get("error") or "request refused"))
    return reply


def daemon_running(path: Path, *, timeout: float = 5.0) -> bool:
    """Whether a daemon answers a ping on ``path``."""
    try:
        call(path, {"op": "ping"}, timeout=timeout)
    except DaemonNotRunning:
        return False
    return True


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise QmgrdError("the daemon closed the control connection without a reply")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > REPLY_LIMIT:
            raise QmgrdError("the daemon's reply is too long")
