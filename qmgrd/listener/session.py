"""One SMTP session: the asyncio adapter driving ``ServerProtocol``, and qmgrd's policy.

The adapter reads what the socket has (at most ``_READ_SIZE`` bytes at a
time, each read bounded by ``smtpd_timeout``), feeds it to the sans-IO
``ServerProtocol`` and handles its events one at a time; replies are
collected and written when the protocol needs more input, so a pipelined
group of commands is answered with one write (RFC 2920). The StreamReader
stops reading the socket while its buffer is full, so a client that sends
faster than we handle is held back by TCP, never by our memory.

The transaction is written to disk as it arrives (``qmgrd.spool.writer``):
recipients at RCPT, content during DATA, flushed by a worker thread every
``FLUSH_SIZE`` bytes; memory per session is bounded by that buffer and one
read, whatever the message size or recipient count. The reply to DATA is
``250 2.0.0 Ok: queued as ID`` only after the group committer has made the
file durable; a spool failure is ``451 4.3.0``. A refused, reset or aborted
transaction (RSET, HELO, QUIT, timeout, lost connection, 552) leaves no file.

Replies and limits follow Postfix's smtpd: ``message_size_limit`` → 552
5.3.4 (the rest of the message is read and dropped), ``smtpd_recipient_limit``
→ 452 4.5.3, relaying outside mynetworks → 554 5.7.1, a spool file system too
full for the message (``queue_minfree``, at least 64 KiB, plus SIZE) → 452
4.3.1 at MAIL; every 4xx/5xx reply counts as an error and
``smtpd_hard_error_limit`` errors end the session with ``421 4.7.0 HOST
Error: too many errors``; NOOP, VRFY, ETRN and RSET beyond
``smtpd_junk_command_limit`` count as errors. A session idle beyond
``smtpd_timeout`` is closed (logged, no reply). AUTH: see ``auth_command``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass

from qmgrd.daemon.metrics_intake import NULL_INTAKE, IntakeObserver
from qmgrd.errors import SpoolError
from qmgrd.listener.auth import PasswordChecker, auth_allowed
from qmgrd.listener.commands import HANDLERS
from qmgrd.listener.limits import ClientCounters
from qmgrd.listener.protocol import (
    Closed,
    Command,
    Content,
    DataEnd,
    Dialogue,
    Event,
    LineTooLong,
    ServerProtocol,
)
from qmgrd.listener.settings import ListenerSettings
from qmgrd.log import get_logger
from qmgrd.spool import GroupCommitter
from qmgrd.spool.writer import EnvelopeHead, QueueFileWriter

_READ_SIZE = 65536
_WRITE_HIGH = 256 * 1024  # replies buffered in the transport before we wait for the client
_MIN_FREE = 65536  # spool bytes MAIL wants free even with queue_minfree = 0 (a queue file)
_JUNK = frozenset({"NOOP", "VRFY", "ETRN", "RSET"})
_NOT_ERRORS = ("421", "452 4.5.3")  # replies that do not count towards the error limit


@dataclass(slots=True, eq=False)
class ListenerContext:
    """What every session shares; passed in, nothing global."""

    committer: GroupCommitter
    on_commit: Callable[[str], None]
    clock: Callable[[], float]
    counters: ClientCounters
    passwords: PasswordChecker
    observer: IntakeObserver = NULL_INTAKE  # intake metrics (qmgrd.daemon.metrics_intake)


@dataclass(slots=True, eq=False)
class Transaction:
    """The state between MAIL and the end of DATA."""

    sender: str
    smtputf8: bool
    file: QueueFileWriter  # the queue file being written
    failed: bool = False  # a spool write failed: 451 until the transaction ends


class Session:
    """One client connection (see the module docstring)."""

    __slots__ = (
        "_closing",
        "_disk",
        "_out",
        "auth_failures",
        "client",
        "client_addr",
        "ctx",
        "dialogue",
        "errors",
        "junk",
        "last_verb",
        "log",
        "proto",
        "reader",
        "relay_ok",
        "sasl_method",
        "sasl_user",
        "settings",
        "txn",
        "writer",
    )

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: ListenerSettings,
        ctx: ListenerContext,
        client_addr: str,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.settings = settings
        self.ctx = ctx
        self.client_addr = client_addr
        self.client = f"unknown[{client_addr}]"  # Postfix's name[addr]; no reverse DNS lookup
        self.relay_ok = settings.permits_relay(client_addr)
        self.proto = ServerProtocol()
        self.dialogue = Dialogue()
        self.txn: Transaction | None = None
        self.sasl_user: str | None = None  # set by a successful AUTH
        self.sasl_method: str | None = None
        self.auth_failures = 0
        self.errors = 0
        self.junk = 0
        self.last_verb = "CONNECT"
        self.log = get_logger("smtpd")
        self._out: list[bytes] = []
        self._closing = False
        self._disk: asyncio.Future[None] | None = None  # the queue file's thread work

    # -- the adapter -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until QUIT, an error limit, a timeout or the client's close."""
        try:
            self.reply(f"220 {self.settings.banner}")
            await self._serve()
            await self.flush()
        except TimeoutError:
            self.log.info("timeout", after=self.last_verb, client=self.client)
        except (ConnectionError, OSError):
            self.log.info("lost connection", after=self.last_verb, client=self.client)
        finally:
            try:
                await self.abort_transaction()
            finally:
                self.writer.close()

    def close(self) -> None:
        """Disconnect now (listener shutdown); ``run`` then cleans up."""
        self.writer.transport.abort()

    async def _serve(self) -> None:
        while not self._closing:
            event = await self.next_event()
            if isinstance(event, Closed):
                return
            if isinstance(event, LineTooLong):
                self.reply("500 5.5.2 Error: command line too long")
            elif isinstance(event, Command):
                self.last_verb = event.verb if event.verb.isalpha() else "UNKNOWN"
                handler = HANDLERS.get(event.verb)
                if handler is None:
                    self.reply("502 5.5.2 Error: command not recognized")
                else:
                    if event.verb in _JUNK:
                        self.junk += 1
                        if self.junk > self.settings.junk_command_limit:
                            self.errors += 1
                    await handler(self, event.arg)
            if self.errors >= self.settings.hard_error_limit and not self._closing:
                self.log.warning("too many errors", after=self.last_verb, client=self.client)
                self.reply(f"421 4.7.0 {self.settings.myhostname} Error: too many errors")
                self._closing = True

    async def next_event(self) -> Event:
        """The protocol's next event, reading (and flushing replies) while it needs data."""
        while True:
            event = self.proto.next_event()
            if event is not None:
                return event
            await self.flush()
            async with asyncio.timeout(self.settings.smtpd_timeout):
                data = await self.reader.read(_READ_SIZE)
            if data:
                self.proto.receive_data(data)
            else:
                self.proto.receive_eof()

    def reply(self, text: str) -> None:
        """Queue one reply line (written at the next flush); 4xx/5xx count as errors."""
        if text[0] in "45" and not text.startswith(_NOT_ERRORS):
            self.errors += 1
        self._out.append(text.encode("utf-8", "surrogateescape") + b"\r\n")
        self.ctx.observer.replied(text)

    async def flush(self) -> None:
        """Write the queued replies; wait for the client while too much is unread."""
        if self._out:
            self.writer.write(b"".join(self._out))
            self._out.clear()
        if self.writer.transport.get_write_buffer_size() > _WRITE_HIGH:
            async with asyncio.timeout(self.settings.smtpd_timeout):
                await self.writer.drain()

    def end_session(self) -> None:
        """Close after the queued replies are written (QUIT, 421)."""
        self._closing = True

    # -- the transaction -------------------------------------------------------------

    @property
    def auth_offered(self) -> bool:
        """AUTH is enabled and this channel may carry a clear-text password."""
        if self.settings.sasl_credentials is None:
            return False
        tls = self.writer.get_extra_info("sslcontext") is not None
        return auth_allowed(self.client_addr, tls=tls)

    def spool_has_room(self, size: int) -> bool:
        """Whether the spool's file system can take a message of ``size`` bytes now."""
        try:
            st = os.statvfs(self.ctx.committer.spool.root)
        except OSError:
            return True  # cannot tell: let the commit decide (451 if it fails)
        free = st.f_bavail * st.f_frsize
        return free >= max(self.settings.queue_minfree, _MIN_FREE) + size

    def begin_transaction(self, head: EnvelopeHead) -> None:
        writer = QueueFileWriter(self.ctx.committer.spool, head)
        self.txn = Transaction(head.sender, head.smtputf8, writer)
        self.dialogue.move("mail")

    async def disk(self, func: Callable[[], None]) -> None:
        """Run the queue file's disk work in a thread; it completes even if we are cancelled.

        ``abort_transaction`` waits for it before removing the file, so a
        flush can never write to a descriptor that was closed (and reused).
        """
        work = asyncio.ensure_future(asyncio.to_thread(func))
        self._disk = work
        await asyncio.shield(work)

    async def abort_transaction(self) -> None:
        """Drop the transaction in progress and its temporary file, if any."""
        txn, self.txn = self.txn, None
        if txn is None:
            return
        if self._disk is not None and not self._disk.done():
            await asyncio.wait({self._disk})
        if self.dialogue.in_transaction:
            self.dialogue.move("reset")
        await self.disk(txn.file.discard)

    async def write_out(self, txn: Transaction) -> bool:
        """Flush the writer's buffer if full; False (logged, writer gone) on a spool error."""
        if not txn.file.needs_flush:
            return True
        try:
            await self.disk(txn.file.flush)
        except SpoolError as exc:
            self.log.warning("queue file write error", client=self.client, reason=str(exc))
            txn.failed = True
            return False
        return True

    async def read_data(self, txn: Transaction) -> tuple[bool, bool]:
        """Receive the message into the writer; (too big, write failed) at the end marker."""
        limit = self.settings.message_size_limit
        too_big = False
        txn.file.begin_content()
        self.proto.start_data()
        while True:
            event = await self.next_event()
            if isinstance(event, DataEnd):
                return too_big, txn.failed
            if isinstance(event, Closed):
                raise ConnectionResetError("connection closed during DATA")
            if not isinstance(event, Content) or too_big or txn.failed:
                continue
            if limit and txn.file.content_size + len(event.data) > limit:
                too_big = True
                await self.disk(txn.file.discard)  # keep reading, store nothing more
                continue
            txn.file.add_content(event.data)
            await self.write_out(txn)
