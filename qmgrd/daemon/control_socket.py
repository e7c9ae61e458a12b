"""Where the control socket lives and how a Unix socket path of any length is reached.

Contract
--------
- ``control_socket_path(queue_directory)``: ``<queue_directory>/public/qmgrd.sock``
  (``SOCKET_NAME``; the server makes it mode ``SOCKET_MODE``, 0660).
- ``unix_address(path)``: a context manager giving a ``sun_path`` for
  ``path``, also when it is longer than Linux's 107 bytes (through
  ``/proc/self/fd/N/name`` of its open directory); SpoolError if the
  directory cannot be opened.
- ``await remove_stale_socket(path)``: unlink a socket left by a dead daemon;
  SpoolError if ``path`` is not a socket or another daemon still answers on it.

Used by the server (``qmgrd.daemon.control``) and the CLI client
(``qmgrd.ops.client``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

from qmgrd.errors import SpoolError

__all__ = [
    "SOCKET_MODE",
    "SOCKET_NAME",
    "control_socket_path",
    "remove_stale_socket",
    "unix_address",
]

SOCKET_NAME = "qmgrd.sock"
SOCKET_MODE = 0o660
_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux


def control_socket_path(queue_directory: Path) -> Path:
    """Where the daemon listens for the CLI: ``<queue_directory>/public/qmgrd.sock``."""
    return queue_directory / "public" / SOCKET_NAME


@contextlib.contextmanager
def unix_address(path: Path) -> Iterator[str]:
    """A ``sun_path`` for ``path``, also when ``path`` is longer than the kernel allows.

    Linux limits socket paths to 107 bytes; deep spool directories (and test
    temporaries) exceed that. A longer path is reached through an open
    descriptor of its directory, ``/proc/self/fd/N/name``, valid while the
    context is open (for one bind or connect).
    """
    text = str(path)
    if len(os.fsencode(text)) <= _SUN_PATH_MAX:
        yield text
        return
    try:
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SpoolError(f"cannot open {path.parent}: {exc.strerror}") from exc
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


async def remove_stale_socket(path: Path) -> None:
    """Unlink a socket left by a dead daemon; refuse one that still answers."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise SpoolError(f"cannot inspect control socket {path}: {exc.strerror}") from exc
    if not stat.S_ISSOCK(mode):
        raise SpoolError(f"{path} exists and is not a socket; remove it")
    if await _answers(path):
        raise SpoolError(f"another qmgrd answers on {path}; is the daemon already running?")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SpoolError(f"cannot remove stale control socket {path}: {exc.strerror}") from exc


async def _answers(path: Path) -> bool:
    def probe() -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            try:
                with unix_address(path) as address:
                    sock.connect(address)
            except OSError:
                return False
            return True

    return await asyncio.to_thread(probe)
