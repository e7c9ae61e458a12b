"""Accepting on listening sockets: batches per wake-up, holds after refusals, EMFILE pauses.

Contract
--------
An :class:`Acceptor` watches non-blocking listening sockets on the loop (a
reader callback each) and hands every accepted connection to
``admit(conn, addr)``, which starts a session or refuses the client and
answers False when it refused for lack of capacity (the listener's
``ListenerHandle._admit``). Up to ``batch`` connections are accepted per
wake-up (``ACCEPT_BATCH``; listener worker processes sharing a socket take
few, so that an idle one gets its share; set it before ``listen``: it is
read when a socket starts being watched), and no more than wait in the
socket's queue as the kernel counts them (:func:`queued`, Linux; elsewhere
until ``accept`` says EAGAIN): no ``accept`` is tried while no client waits.
An accepted socket is a ``socket.socket`` whose ``family`` and ``type`` read
as plain ints (uvloop's ``connect_accepted_socket`` reads them; the enum
conversions cost more than the rest of ``accept``).

A refusal for capacity costs as little as it can: :func:`refuse` sends the
reply line once, before any session, TLS or banner, then closes. An acceptor
whose ``admit`` refused for capacity also stops watching that socket for
``REFUSE_HOLD`` seconds (several listener processes share each listening
socket: the connections go meanwhile to one that has room), then answers
every client waiting in it, ``ACCEPT_DRAIN`` at most, in one go (admitted if
there is room again, refused otherwise): a refused client waits
``REFUSE_HOLD`` plus the loop's lag at most, and a flood costs one wake-up
per hold, not one per connection in every process. A session that ends
during a hold frees its place at once: the listener calls ``room()``, which
takes the client waiting longest in a held socket (admitted if the gate
still has room), so the sessions the cap allows stay busy through the hold
instead of waiting for its end.

When ``accept`` fails for lack of file descriptors or memory (EMFILE,
ENFILE, ENOBUFS, ENOMEM) the acceptor logs a warning, stops accepting for
``_ACCEPT_RETRY`` seconds (the pending clients wait in the kernel's backlog)
and then tries again: sessions in progress go on, and new clients are
served as soon as descriptors are free again.

``close()`` stops watching and closes the sockets.
"""

from __future__ import annotations

import _socket
import asyncio
import contextlib
import errno
import socket
import struct
from collections.abc import Callable

from qmgrd.listener.inflow import OVERLOAD_REPLY
from qmgrd.log import get_logger

__all__ = ["ACCEPT_BATCH", "ACCEPT_DRAIN", "REFUSE_HOLD", "UNAVAILABLE", "Acceptor", "refuse"]

ACCEPT_BATCH = 64  # connections accepted per wake-up before other work runs
ACCEPT_DRAIN = 256  # connections answered at most when a hold ends
REFUSE_HOLD = 0.02  # seconds a listener that refused for capacity leaves its socket alone
UNAVAILABLE = OVERLOAD_REPLY.encode("ascii") + b"\r\n"
_ACCEPT_RETRY = 0.5  # seconds without accepting after EMFILE and friends
_HOLD_FOR_FIN = getattr(socket, "MSG_MORE", 0) | getattr(socket, "MSG_DONTWAIT", 0)  # refuse()
_TCP_INFO: int = getattr(socket, "TCP_INFO", 0)  # Linux only (queued); 0: none
_TCP_LISTEN = 10  # tcpi_state of a listening socket (Linux's TCP_LISTEN)
_IPPROTO_TCP = int(socket.IPPROTO_TCP)
_unacked = struct.Struct("=I").unpack_from  # tcpi_unacked, at offset 24 of struct tcp_info
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class _Accepted(socket.socket):
    """An accepted connection whose ``family`` and ``type`` are the plain ints.

    ``socket.socket`` converts them to enums on every read (~1 us each);
    uvloop's ``connect_accepted_socket`` reads them three times per connection.
    Everything else is ``socket.socket``'s (uvloop detaches it when it closes).
    """

    __slots__ = ()
    family = _socket.socket.family  # type: ignore[assignment]
    type = _socket.socket.type  # type: ignore[assignment]


class Acceptor:
    """The listening sockets of one listener (see the module doc)."""

    __slots__ = ("_admit", "_held", "_kinds", "_loop", "batch", "sockets")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        admit: Callable[[socket.socket, str], bool],
        batch: int = ACCEPT_BATCH,
    ) -> None:
        self._loop = loop
        self._admit = admit
        self.batch = batch
        self.sockets: list[socket.socket] = []
        self._held: dict[socket.socket, asyncio.TimerHandle] = {}  # sockets in a hold
        # family, type, proto, and whether the kernel tells how many clients wait (queued)
        self._kinds: dict[socket.socket, tuple[int, int, int, bool]] = {}

    def listen(self, sock: socket.socket) -> None:
        """Watch ``sock`` (non-blocking, listening)."""
        self.sockets.append(sock)
        counted = queued(sock) >= 0
        self._kinds[sock] = (sock.family, sock.type, sock.proto, counted)
        self._watch(sock)

    def _watch(self, sock: socket.socket) -> None:
        """Accept on ``sock`` when it is readable, ``batch`` at most per wake-up (the reader
        callback is ``_accept`` itself: no call of a method of ours in between)."""
        self._loop.add_reader(sock.fileno(), self._accept, sock, self.batch)

    def _accept(self, sock: socket.socket, count: int) -> int:
        """Accept up to ``count`` connections; after a refusal for capacity, hold (module doc).
        How many were accepted."""
        full = False
        accepted = 0
        family, kind, proto, counted = self._kinds[sock]
        if counted:  # no accept past the last waiting client (its EAGAIN costs more)
            try:
                waiting = _unacked(sock.getsockopt(_IPPROTO_TCP, _TCP_INFO, 28), 24)[0]
            except OSError:
                waiting = count
            if waiting < count:
                count = waiting
        for _ in range(count):
            try:
                # socket.accept's own two steps, without its enum conversions.
                fd, peer = sock._accept()  # type: ignore[attr-defined]
                conn = _Accepted(family, kind, proto, fd)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    self._pause(sock, exc)
                    return accepted
                continue  # ECONNABORTED and the like: that client is gone
            accepted += 1
            if not self._admit(conn, str(peer[0]) if peer else "unknown"):
                full = True
        if full and sock not in self._held:
            self._loop.remove_reader(sock.fileno())
            self._held[sock] = self._loop.call_later(REFUSE_HOLD, self._drain, sock)
        return accepted

    def _drain(self, sock: socket.socket) -> None:
        """After a hold: watch the socket again, and answer every client waiting in it."""
        self._held.pop(sock, None)
        if sock.fileno() >= 0:  # not closed meanwhile
            self._watch(sock)
            self._accept(sock, ACCEPT_DRAIN)

    def room(self) -> None:
        """A session ended: during a hold, take the client waiting longest (module doc)."""
        if not self._held:  # the usual: no hold
            return
        for sock in list(self._held):
            if sock.fileno() >= 0 and self._accept(sock, 1):
                return

    def _pause(self, sock: socket.socket, exc: OSError) -> None:
        get_logger("smtpd").warning(
            "accept connection: out of resources; new clients wait",
            error=exc.strerror or str(exc),
            retry_in=f"{_ACCEPT_RETRY}s",
        )
        self._loop.remove_reader(sock.fileno())
        self._loop.call_later(_ACCEPT_RETRY, self._resume, sock)

    def _resume(self, sock: socket.socket) -> None:
        if sock.fileno() >= 0:  # not closed meanwhile
            self._watch(sock)

    def close(self) -> None:
        """Stop watching the sockets and close them."""
        for timer in self._held.values():
            timer.cancel()
        self._held.clear()
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self._loop.remove_reader(sock.fileno())
                sock.close()


def queued(sock: socket.socket) -> int:
    """Clients waiting in the accept queue of the listening TCP socket ``sock``; -1 unknown.

    Linux's ``TCP_INFO`` of a listening socket: ``tcpi_unacked`` is the accept
    queue's length (``tcpi_sacked`` its bound). One ``getsockopt``, cheaper than
    the ``accept`` that fails with EAGAIN at the end of a batch.
    """
    if not _TCP_INFO:
        return -1
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 32)
    except OSError:
        return -1
    if len(info) < 28 or info[0] != _TCP_LISTEN:
        return -1
    return int(_unacked(info, 24)[0])


def refuse(conn: socket.socket, reply: str | bytes) -> None:
    """Send one reply line to a connection we will not serve, and close it.

    The cheapest answer there is: no TLS, no banner, no session, no log line
    (the callers count refusals and log them a second at a time), and two
    system calls: one non-blocking send (``MSG_DONTWAIT``: no switch of the
    socket's mode) of a line that fits any socket buffer, held back
    (``MSG_MORE``) so that ``close`` sends it with the FIN in one segment
    (the client reads the reply, then the end of the stream, as before;
    two fewer segments to send and acknowledge per refusal).
    """
    line = reply if isinstance(reply, bytes) else reply.encode("ascii", "replace") + b"\r\n"
    with contextlib.suppress(OSError):  # the client is gone already
        conn.send(line, _HOLD_FOR_FIN)
    conn.close()
