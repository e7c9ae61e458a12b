"""One SMTP client connection: a thin asyncio Protocol around ``client.ReplyParser``.

The client twin of ``qmgrd.listener.channel``. Bytes that arrive are parsed
at once into replies that wait in a queue (a pipelined group's replies come
in one read); the session takes them in order with ``read_reply(timeout)``:

- ``read_reply`` returns the oldest queued reply (``next_reply``: the same
  without a coroutine, None when none is queued); only when none is queued it
  waits, at most ``timeout`` seconds (TimeoutError then). Replies that arrived
  before the connection broke are still handed out; then the error (a
  ``ReplyError`` for a broken reply, else ConnectionError) is raised on every
  later read.
- Reading is paused while more than ``QUEUE_LIMIT`` replies wait unread, so a
  server that floods replies is held back by TCP, not by our memory; a broken
  reply aborts the connection at once.
- ``write`` / ``writelines`` / ``drain(timeout)`` follow the transport's write
  flow control; a write after the connection is gone raises ConnectionError.
- ``start_tls(ctx, server_hostname, timeout)`` returns a NEW connection on
  the TLS transport (``loop.start_tls``); whatever the server sent in clear
  text after its 220 is dropped with the old one (CVE-2011-0411 from the
  client side: no reply can be injected before the handshake).

Nothing here reads a clock except the loop's, for timeouts.

Theory of operation (the read timeout): a wait sets the connection's deadline
(``loop.time() + timeout``); one timer per connection is armed at a deadline
and stays armed across waits. When it fires while a wait's deadline is the one
it was armed for, that wait fails with TimeoutError; when the deadline has
moved on (later waits), it is re-armed for the current one; with no wait it
is dropped. A wait whose deadline is earlier than the armed timer's re-arms
it. So a wait costs a clock read, not a timer made and cancelled (two per
delivery on a cached session), and no wait outlives its deadline.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import Iterable
from typing import Any, cast

from qmgrd.delivery.client import Reply, ReplyError, ReplyParser
from qmgrd.flowcontrol import WriteFlow

QUEUE_LIMIT = 1024  # unread replies before reading pauses (a group has one per command)


class Connection(asyncio.Protocol):
    """Reply queue and flow-controlled writes over one transport (module doc)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = ReplyParser()
        self.replies: collections.deque[Reply] = collections.deque()
        self.error: BaseException | None = None
        self.closed = False
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        self._deadline = 0.0  # loop time the current wait ends (module doc)
        self._timer: asyncio.TimerHandle | None = None  # armed at _timer_at, or None
        self._timer_at = 0.0
        self._flow = WriteFlow()  # the transport's write pause
        # The transport's loop, looked up once: on Python 3.11 every get_running_loop is a
        # getpid system call, and a delivery waits for replies twice.
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, hence the cast.
        self.transport = cast(asyncio.Transport, transport)
        self._loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        if self.error is not None:
            return
        parser = self.parser
        parser.feed(data)
        try:
            parser.replies(self.replies.append)
        except ReplyError as exc:
            self.error = exc
            if self.transport is not None:
                self.transport.abort()
        if len(self.replies) > QUEUE_LIMIT and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        if self.replies or self.error is not None:  # a partial reply wakes nobody
            self._wake()

    def eof_received(self) -> bool:
        if self.error is None:
            self.error = ConnectionResetError("Connection closed by the server")
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if self.error is None:
            self.error = exc or ConnectionResetError("Connection lost")
        self._wake()
        self._flow.fail(ConnectionResetError("Connection lost"))

    def pause_writing(self) -> None:
        self._flow.pause()

    def resume_writing(self) -> None:
        self._flow.resume()

    # -- the session's side ------------------------------------------------------------

    @property
    def is_connected(self) -> bool:
        """Whether the transport is still open."""
        return not self.closed and self.transport is not None and self.error is None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The transport's extra info (``ssl_object``, ``peername``, ...)."""
        if self.transport is None:
            return default
        return self.transport.get_extra_info(name, default)

    def next_reply(self) -> Reply | None:
        """The oldest reply already queued, or None (then ``read_reply`` waits for one)."""
        replies = self.replies
        if not replies:
            return None
        reply = replies.popleft()
        if self._paused and len(replies) <= QUEUE_LIMIT // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return reply

    async def read_reply(self, timeout: float) -> Reply:
        """The next reply (module doc); TimeoutError, ReplyError or ConnectionError."""
        replies = self.replies
        if not replies:
            if self.error is not None:
                raise self.error
            loop = self._loop or asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            deadline = self._deadline = loop.time() + timeout
            if self._timer is None or self._timer_at > deadline:
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(deadline, self._on_timer)
                self._timer_at = deadline
            try:
                await waiter
            finally:
                self._waiter = None
            if not replies:
                raise self.error or ConnectionResetError("Connection lost")
        reply = replies.popleft()
        if self._paused and len(replies) <= QUEUE_LIMIT // 2 and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return reply

    async def command(self, line: bytes, timeout: float) -> Reply:
        """Write one command line (CRLF included) and read its reply."""
        self.write(line)
        return await self.read_reply(timeout)

    def write(self, data: bytes) -> None:
        """Queue bytes for the server; ConnectionError when the connection is gone."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise self.error or ConnectionResetError("Connection lost")
        self.transport.write(data)

    def writelines(self, parts: Iterable[bytes]) -> None:
        """``write`` for several buffers in order, without joining them: on uvloop one
        ``writev`` (the last content chunk and the end of data, no 100 KB copy)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            raise self.error or ConnectionResetError("Connection lost")
        self.transport.writelines(parts)

    async def drain(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until the transport takes writes again."""
        if self.closed:
            raise self.error or ConnectionResetError("Connection lost")
        if not self._flow.paused:
            return
        await asyncio.wait_for(self._flow.wait(), timeout)

    def close(self) -> None:
        """Close at once: the session is over, queued bytes are of no use."""
        if self.transport is not None:
            self.transport.abort()
        self.closed = True
        if self._waiter is None:  # a wait in progress keeps its timeout until it is woken
            self._cancel_timer()

    async def start_tls(
        self, context: ssl.SSLContext, server_hostname: str, timeout: float
    ) -> Connection:
        """Handshake as the client; the new connection (this one is dropped, module doc).

        Raises ssl.SSLError, ConnectionError or TimeoutError when the handshake fails.
        """
        if self.transport is None or self.closed:
            raise self.error or ConnectionResetError("Connection lost")
        fresh = Connection()
        self.replies.clear()
        self.parser.clear()  # clear text after the 220: never read (module doc)
        tls = await asyncio.get_running_loop().start_tls(
            self.transport,
            fresh,
            context,
            server_side=False,
            server_hostname=server_hostname,
            ssl_handshake_timeout=timeout,
        )
        if tls is None:  # the loop closed the connection meanwhile
            raise ConnectionResetError("connection closed during the TLS handshake")
        fresh.connection_made(tls)
        self.transport = None  # owned by the TLS transport from now on
        self.closed = True
        self._cancel_timer()
        return fresh

    def _on_timer(self) -> None:
        """The timer fired at ``_timer_at``: time out the wait, re-arm, or drop (module doc)."""
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._deadline <= self._timer_at:
            waiter.set_exception(TimeoutError())
            return
        loop = self._loop or asyncio.get_running_loop()
        self._timer = loop.call_at(self._deadline, self._on_timer)
        self._timer_at = self._deadline

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
