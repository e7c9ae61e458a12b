"""One client connection's byte channel: an asyncio Protocol with bounded reads and drain.

A ``Channel`` is what a session reads from and writes to. It replaces the
StreamReader/StreamWriter pair so that STARTTLS can be done with public
asyncio APIs only and without carrying plaintext across the TLS boundary:

- ``read(n)`` returns what arrived (at most ``n`` bytes), ``b""`` at end of
  stream; the transport is paused while more than ``limit`` bytes wait, so a
  client that sends faster than we handle is held back by TCP. Chunks are
  kept as the transport delivered them: a read that takes a whole chunk
  returns that very object (no copy; DATA's 100 KB pass through untouched);
  small chunks (pipelined commands) that fit are joined into one read, a
  chunk of ``_WHOLE`` bytes or more is always read alone (never copied);
- ``read(n, timeout)`` gives up after ``timeout`` seconds of waiting with
  TimeoutError. Theory of operation: the reads' deadlines are watched by a
  :class:`Deadlines`, ONE loop timer for every channel that shares it (a
  listener's: ``Channel(..., deadlines=)``; else the channel's own), armed
  at or before the earliest deadline of a waiting read. A read sets its
  channel's deadline, which only moves later in a normal session, so a read
  that waits costs no timer set-up and cancel, and a session none: the
  timer is re-armed only when a read's deadline is earlier than it, or when
  it fires (then at the earliest deadline still ahead, after failing the
  reads whose deadline has come; none when no read waits). A channel leaves
  its ``Deadlines`` when the connection is lost or handed to TLS (nothing
  keeps a closed channel alive); the timer is cancelled when no channel is
  left. A read still times out ``timeout`` seconds (loop time) after it
  began to wait, to the loop's timer resolution (``_TICK``: a deadline that
  close is due);
- ``write`` / ``drain`` follow the transport's write flow control;
- ``start_tls(ctx)`` (server side, ``loop.start_tls``) returns a NEW channel
  on the TLS transport. Bytes the client sent before the handshake stay in
  the old channel and are dropped with it: nothing pipelined after STARTTLS
  in clear text can be read as if it came over TLS (CVE-2011-0411, the
  STARTTLS command injection).

A channel is never shared between sessions; nothing here reads a clock.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from collections import deque
from typing import Any

from qmgrd.flowcontrol import WriteFlow

_WHOLE = 4096  # a chunk this big is read on its own: joining it would copy it
_TICK = 0.001  # seconds: the loop's timer resolution (uvloop's); closer to a deadline is at it


class Deadlines:
    """One loop timer for the read deadlines of every channel that shares it (module doc).

    Invariant: while a watched channel has a read waiting with a deadline, the
    timer is armed (``armed_at``) no later than that deadline.
    """

    __slots__ = ("_loop", "_timer", "_watched", "armed_at")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._watched: set[Channel] = set()
        self._timer: asyncio.TimerHandle | None = None
        self.armed_at = math.inf  # loop time the timer fires (inf: not armed)

    def watch(self, chan: Channel, deadline: float) -> None:
        """``chan`` has a read waiting until ``deadline`` (its ``_deadline``)."""
        self._watched.add(chan)
        chan._watched = True
        if deadline < self.armed_at:
            self._arm(deadline)

    def forget(self, chan: Channel) -> None:
        """``chan`` is read no more; the timer goes with the last channel."""
        self._watched.discard(chan)
        chan._watched = False
        if not self._watched and self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self.armed_at = math.inf

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.armed_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        """Fail the reads whose deadline has come; arm for the earliest one still ahead."""
        self._timer = None
        self.armed_at = math.inf
        due = self._loop.time() + _TICK
        ahead = math.inf
        for chan in list(self._watched):
            deadline = chan._deadline
            if deadline is None:  # no read waiting there
                continue
            if deadline <= due:
                chan._expire()
            elif deadline < ahead:
                ahead = deadline
        if ahead < math.inf:
            self._arm(ahead)


class Channel(asyncio.Protocol):
    """Bounded reading and flow-controlled writing over one transport (module docstring)."""

    __slots__ = (
        "__weakref__",  # tests check a lost connection lets the channel go
        "_chunks",
        "_closed",
        "_deadline",
        "_deadlines",
        "_eof",
        "_expired",
        "_flow",
        "_loop",
        "_lost",
        "_paused",
        "_read_waiter",
        "_size",
        "_watched",
        "limit",
        "tls",
        "transport",
    )

    def __init__(
        self,
        limit: int,
        *,
        tls: bool = False,
        loop: asyncio.AbstractEventLoop | None = None,
        deadlines: Deadlines | None = None,
    ) -> None:
        """``tls``: the transport will be a TLS one (wrapper mode, ``start_tls``); ``loop``:
        the transport's (else the running loop at ``connection_made``); ``deadlines``: the
        timer shared with other channels (else one of its own, made on first use)."""
        self.limit = limit
        self.tls = tls  # this channel runs over TLS
        self.transport: asyncio.Transport | None = None
        self._chunks: deque[bytes] = deque()  # as received, oldest first
        self._size = 0  # bytes in _chunks
        self._loop = loop  # the transport's (else set on connect)
        self._eof = False
        self._lost: BaseException | None = None
        self._closed = False
        self._paused = False  # we paused the transport's reading
        self._read_waiter: asyncio.Future[None] | None = None
        self._expired = False  # the current read's deadline passed
        self._deadline: float | None = None  # loop time the waiting read gives up (None: never)
        self._deadlines = deadlines  # who watches _deadline
        self._watched = False  # in _deadlines (from the first read that waits with a deadline)
        self._flow = WriteFlow()  # the transport's write pause

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses (typing.cast's call
        # would cost as much as the rest of this method).
        self.transport = transport  # type: ignore[assignment]
        # Called by the loop: looked up once here, not per read (asyncio's lookup
        # of the running loop costs a getpid system call on Python 3.11), unless given.
        if self._loop is None:
            self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if data:
            # bytes as they come (uvloop's); another buffer type is copied into bytes
            self._chunks.append(data if type(data) is bytes else bytes(data))
            self._size += len(data)
        if self._size > self.limit and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        waiter = self._read_waiter  # _wake_reader's steps (this runs for every chunk)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def eof_received(self) -> bool:
        self._eof = True
        self._wake_reader()
        # Plain TCP: keep the transport open so queued replies can still be sent.
        return not self.tls

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._drop_timer()
        self._lost = exc
        self._eof = True
        self._wake_reader()
        if self._flow.paused:  # only a paused transport has a writer waiting (drain)
            self._flow.fail(exc or ConnectionResetError("connection lost"))

    def pause_writing(self) -> None:
        self._flow.pause()

    def resume_writing(self) -> None:
        self._flow.resume()

    # -- the session's side -----------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The transport's extra info (``peername``, ``ssl_object``, ...)."""
        if self.transport is None:
            return default
        return self.transport.get_extra_info(name, default)

    async def read(self, n: int, timeout: float | None = None) -> bytes:
        """At most ``n`` bytes that arrived, waiting for some; ``b""`` at the end of the stream.

        TimeoutError when nothing arrived within ``timeout`` seconds. Only a read
        that has to wait has a deadline (a pipelined command costs none); the
        channel's one timer watches it (module docstring).
        """
        if not self._size and not self._eof:
            loop = self._loop or asyncio.get_running_loop()
            self._expired = False
            if timeout is not None:
                deadline = self._deadline = loop.time() + timeout
                deadlines = self._deadlines
                if deadlines is None:
                    deadlines = self._deadlines = Deadlines(loop)
                if not self._watched or deadline < deadlines.armed_at:  # else it watches on
                    deadlines.watch(self, deadline)
            try:
                while not self._size and not self._eof:
                    if self._expired:
                        raise TimeoutError
                    self._read_waiter = loop.create_future()
                    await self._read_waiter
            finally:
                self._read_waiter = None
                self._deadline = None
        if not self._size:
            if self._lost is not None:
                raise ConnectionResetError(str(self._lost))
            return b""
        chunks = self._chunks
        if len(chunks) == 1 and len(chunks[0]) <= n:  # the usual: one chunk, read whole
            data = chunks.popleft()
            self._size = 0
        else:
            data = self._take(n)
        if self._paused and self._size <= self.limit and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def _take(self, n: int) -> bytes:
        """At most ``n`` buffered bytes: whole chunks as they are, small ones joined if they fit.

        A chunk of ``_WHOLE`` bytes or more (DATA's) is never joined with another.
        """
        chunks = self._chunks
        first = chunks[0]
        if len(first) > n:  # split: the rest stays first
            chunks[0] = first[n:]
            self._size -= n
            return first[:n]
        chunks.popleft()
        if not chunks or len(first) >= _WHOLE or len(first) + len(chunks[0]) > n:
            self._size -= len(first)
            return first
        parts = [first]
        taken = len(first)
        while chunks and len(chunks[0]) < _WHOLE and taken + len(chunks[0]) <= n:
            part = chunks.popleft()
            parts.append(part)
            taken += len(part)
        self._size -= taken
        return b"".join(parts)

    def write(self, data: bytes) -> int:
        """Queue ``data``; the bytes written and not yet sent (``write_buffer_size``)."""
        transport = self.transport
        if transport is None or self._closed:
            return 0
        transport.write(data)
        return transport.get_write_buffer_size()

    def write_buffer_size(self) -> int:
        """Bytes written and not yet sent."""
        if self.transport is None or self._closed:
            return 0
        return self.transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Wait until the transport takes writes again; ConnectionError if the client is gone."""
        if self._closed:
            raise ConnectionResetError("connection lost")
        if not self._flow.paused:
            return
        await self._flow.wait()

    def close(self) -> None:
        """Close after sending what is queued."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is queued."""
        if self.transport is not None:
            self.transport.abort()

    async def start_tls(self, context: ssl.SSLContext, timeout: float) -> Channel:
        """Handshake as the server; the new channel (this one and its unread bytes are dropped).

        Raises ssl.SSLError, ConnectionError or TimeoutError when the
        handshake fails; the connection is then closed.
        """
        if self.transport is None:
            raise ConnectionResetError("connection lost")
        loop = asyncio.get_running_loop()
        await self.drain()
        fresh = Channel(self.limit, tls=True, loop=loop, deadlines=self._deadlines)
        self._chunks.clear()  # pipelined clear text: never read (CVE-2011-0411)
        self._size = 0
        # Read no more, whatever the handshake's outcome: its transport's protocol is the
        # TLS one from now on, so no connection_lost would take it out of its Deadlines.
        self._drop_timer()
        tls_transport = await loop.start_tls(
            self.transport, fresh, context, server_side=True, ssl_handshake_timeout=timeout
        )
        if tls_transport is None:  # the loop closed the connection meanwhile
            raise ConnectionResetError("connection closed during the TLS handshake")
        fresh.connection_made(tls_transport)
        self.transport = None  # owned by the TLS transport from now on
        return fresh

    def _expire(self) -> None:
        """The waiting read's deadline has come (``Deadlines``): it raises TimeoutError."""
        self._expired = True
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(TimeoutError())

    def _drop_timer(self) -> None:
        """This channel is read no more: out of its ``Deadlines``."""
        if self._watched and self._deadlines is not None:
            self._deadlines.forget(self)

    def _wake_reader(self) -> None:
        waiter = self._read_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
