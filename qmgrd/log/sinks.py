"""Log destinations besides a file: the systemd journal and the syslog socket.

Both carry what Postfix's logs carry and a plain stdout line cannot: the
program identifier ``qmgrd/<component>`` (``syslog_name`` then the component:
``qmgrd/smtpd``, ``qmgrd/qmgr``, ``qmgrd/smtp``, ...), the process id and a
priority, so ``journalctl -u qmgrd`` prints ``host qmgrd/smtp[812]: ...`` and
pflogsumm, fail2ban and logwatch read it as they read Postfix's syslog lines.

Theory of operation
-------------------
- :class:`JournalSink` speaks journald's native protocol (systemd's
  "Native Journal Protocol" document): one datagram per entry on the
  AF_UNIX datagram socket ``/run/systemd/journal/socket``, each field
  ``NAME=value\\n``, or for a value that contains a newline ``NAME\\n``, the
  value's length as a 64-bit little-endian integer, the value and ``\\n``. An
  entry too large for one datagram (EMSGSIZE) is written to a sealed memfd
  whose descriptor is sent alone (SCM_RIGHTS), as the document prescribes.
  Fields: ``MESSAGE``, ``PRIORITY``, ``SYSLOG_FACILITY`` (2, mail),
  ``SYSLOG_IDENTIFIER``, ``SYSLOG_PID``, and ``QUEUE_ID`` when the event has
  one (``journalctl QUEUE_ID=4F9D3C2A1B0E7D6`` shows one message's life).
- :class:`SyslogSink` writes RFC 3164 lines as glibc's ``syslog(3)`` does,
  ``<PRI>Mon DD HH:MM:SS ident[pid]: message``, to ``/dev/log`` (facility
  mail), for a syslog daemon outside systemd.
- :func:`choose_destination` picks one when no ``maillog_file`` is set. The
  journal when standard output *is* the journal: systemd sets
  ``JOURNAL_STREAM=dev:inode`` to the stream it connects, and a process whose
  fd 1 has that device and inode was started by systemd with its output in
  the journal (the documented way to "upgrade" to the native protocol). The
  syslog socket when standard output goes nowhere (closed or ``/dev/null``,
  as under a SysV init script) and ``/dev/log`` exists. Otherwise standard
  output: a terminal, a container's log, a test's pipe.

A send that fails (journald restarting, a full socket buffer for longer
than the send timeout) raises OSError; the caller then writes the line to
standard output instead, so it is not lost.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import stat
import struct
import time
from collections.abc import Mapping
from typing import Literal

__all__ = [
    "JOURNAL_SOCKET",
    "SYSLOG_SOCKET",
    "Destination",
    "JournalSink",
    "SyslogSink",
    "choose_destination",
    "journal_entry",
    "priority_of",
    "stream_is_journal",
]

JOURNAL_SOCKET = "/run/systemd/journal/socket"
SYSLOG_SOCKET = "/dev/log"
FACILITY_MAIL = 2  # syslog(3) LOG_MAIL >> 3

Destination = Literal["stream", "journal", "syslog"]

# syslog(3) severities by structlog method / level name.
_PRIORITIES = {
    "debug": 7,
    "info": 6,
    "warning": 4,
    "warn": 4,
    "error": 3,
    "exception": 3,
    "critical": 2,
    "fatal": 2,
}

# A send may wait this long for room in the receiver's queue before the line
# goes to standard output instead; logging must not wedge the daemon.
SEND_TIMEOUT = 1.0
_SNDBUF = 8 * 1024 * 1024  # what systemd's own client asks for (the kernel may cap it)

_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def priority_of(level: str) -> int:
    """The syslog severity of a structlog level name (info when unknown)."""
    return _PRIORITIES.get(level, 6)


def _field(name: str, value: str) -> bytes:
    data = value.encode("utf-8", "backslashreplace")
    if b"\n" in data:
        return name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
    return name.encode() + b"=" + data + b"\n"


def journal_entry(
    message: str,
    *,
    identifier: str,
    pid: int,
    priority: int,
    queue_id: str | None = None,
) -> bytes:
    """One journal entry in the native protocol's serialization (module doc)."""
    out = [
        _field("MESSAGE", message),
        _field("PRIORITY", str(priority)),
        _field("SYSLOG_FACILITY", str(FACILITY_MAIL)),
        _field("SYSLOG_IDENTIFIER", identifier),
        _field("SYSLOG_PID", str(pid)),
    ]
    if queue_id:
        out.append(_field("QUEUE_ID", queue_id))
    return b"".join(out)


def _datagram_socket() -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SNDBUF)
    sock.settimeout(SEND_TIMEOUT)
    return sock


class JournalSink:
    """Entries to journald over its native datagram socket (module doc)."""

    def __init__(self, path: str = JOURNAL_SOCKET, *, datagram_limit: int | None = None) -> None:
        """``datagram_limit``: entries above it go in a memfd without trying a datagram first
        (None: only when the kernel refuses the datagram)."""
        self.path = path
        self.datagram_limit = datagram_limit
        self._sock = _datagram_socket()

    def send(
        self,
        message: str,
        *,
        identifier: str,
        pid: int,
        priority: int,
        queue_id: str | None = None,
    ) -> None:
        """Send one entry; OSError if journald cannot take it."""
        data = journal_entry(
            message, identifier=identifier, pid=pid, priority=priority, queue_id=queue_id
        )
        if self.datagram_limit is not None and len(data) > self.datagram_limit:
            self._send_memfd(data)
            return
        try:
            self._sock.sendto(data, self.path)
        except OSError as exc:
            if exc.errno not in (errno.EMSGSIZE, errno.ENOBUFS):  # too large for one datagram
                raise
            self._send_memfd(data)

    def _send_memfd(self, data: bytes) -> None:
        fd = os.memfd_create("qmgrd-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.write(fd, data)
            seals = (
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
            )
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", fd))]
            self._sock.sendmsg([b""], rights, 0, self.path)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()


class SyslogSink:
    """RFC 3164 lines to the local syslog socket, as glibc's syslog(3) writes them."""

    def __init__(self, path: str = SYSLOG_SOCKET) -> None:
        self.path = path
        self._sock = _datagram_socket()

    def send(
        self,
        message: str,
        *,
        identifier: str,
        pid: int,
        priority: int,
        queue_id: str | None = None,
        now: float | None = None,
    ) -> None:
        """Send one line (facility mail); OSError if the syslog daemon cannot take it."""
        del queue_id  # syslog has no structured fields
        tm = time.localtime(time.time() if now is None else now)
        stamp = (
            f"{_MONTHS[tm.tm_mon - 1]} {tm.tm_mday:2d} "
            f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d}"
        )
        line = f"<{FACILITY_MAIL * 8 + priority}>{stamp} {identifier}[{pid}]: {message}"
        self._sock.sendto(line.encode("utf-8", "backslashreplace"), self.path)

    def close(self) -> None:
        """Close the socket."""
        self._sock.close()


def stream_is_journal(fd: int, environ: Mapping[str, str]) -> bool:
    """True when ``fd`` is the stream systemd connected to the journal (``JOURNAL_STREAM``)."""
    dev, _, ino = environ.get("JOURNAL_STREAM", "").partition(":")
    if not (dev.isdigit() and ino.isdigit()):
        return False
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (int(dev), int(ino))


def _stream_is_discarded(fd: int) -> bool:
    """True when ``fd`` is closed or ``/dev/null``: what is written there is lost."""
    try:
        st = os.fstat(fd)
    except OSError:
        return True
    try:
        null = os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == null.st_rdev


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def choose_destination(
    fd: int,
    environ: Mapping[str, str],
    *,
    journal_socket: str = JOURNAL_SOCKET,
    syslog_socket: str = SYSLOG_SOCKET,
) -> Destination:
    """Journal, syslog or stream for a process whose log stream is ``fd`` (module doc)."""
    if stream_is_journal(fd, environ) and _is_socket(journal_socket):
        return "journal"
    if _stream_is_discarded(fd) and _is_socket(syslog_socket):
        return "syslog"
    return "stream"
