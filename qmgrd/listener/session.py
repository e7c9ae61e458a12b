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

Cleanup (``settings.cleanup``, the daemon always sets it): MAIL and RCPT
addresses are rewritten (``qmgrd.cleanup.rewrite_sender``/``rewrite_recipient``)
before their syntax check, and DATA streams through a ``HeaderProcessor``
(``start_cleanup``) into the file; ``commands.data`` applies ``decide`` after
the final dot. The queue id it writes into ``Received:`` is the writer's,
drawn at MAIL. Session lines: ``connect``, ``disconnect`` with the command
counts, ``lost connection`` / ``timeout`` / ``too many errors`` after a verb.

Replies and limits follow Postfix's smtpd: ``message_size_limit`` → 552
5.3.4 (the rest of the message is read and dropped), ``smtpd_recipient_limit``
→ 452 4.5.3, relaying outside mynetworks → 554 5.7.1, a spool file system too
full for the message (``queue_minfree``, at least 64 KiB, plus SIZE) → 452
4.3.1 at MAIL; every 4xx/5xx reply counts as an error and
``smtpd_hard_error_limit`` errors end the session with ``421 4.7.0 HOST
Error: too many errors``; NOOP, VRFY, ETRN and RSET beyond
``smtpd_junk_command_limit`` count as errors. A session idle beyond
``smtpd_timeout`` is closed (logged, no reply). AUTH: see ``authcmd.auth``.

TLS (``smtpd_tls_*``, ``qmgrd.listener.tls``): ``starttls`` swaps the
session's ``Channel`` for the TLS one and starts a fresh ``ServerProtocol``
and ``Dialogue``: whatever the client pipelined after STARTTLS in clear
text is discarded, never executed (CVE-2011-0411), and the client must send
EHLO again (RFC 3207 §4.2). ``tls`` then holds the protocol and cipher (for
the logs and a Received header's ``with ESMTPS``).
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from qmgrd.errors import InvariantError
from qmgrd.listener.auth import PasswordChecker, auth_allowed
from qmgrd.listener.channel import Channel
from qmgrd.listener.commands import HANDLERS
from qmgrd.listener.flowgate import NULL_GATE, FlowGate
from qmgrd.listener.inflow import OPEN_GATE, IntakeGate
from qmgrd.listener.limits import ClientCounters, SharedCounts
from qmgrd.listener.observer import NULL_INTAKE, Committed, IntakeObserver
from qmgrd.listener.protocol import (
    Closed,
    Command,
    Dialogue,
    Event,
    LineTooLong,
    ServerProtocol,
)
from qmgrd.listener.room import SpoolRoom
from qmgrd.listener.settings import ListenerSettings
from qmgrd.listener.tls import TlsFacts, session_facts
from qmgrd.listener.transaction import Transaction, TransactionIO
from qmgrd.log import LineLog, get_logger
from qmgrd.log.session import CommandCounts
from qmgrd.spool import GroupCommitter
from qmgrd.spool.recycle import Recycler

_READ_SIZE = 262144  # a whole chunk as the loop delivers it (uvloop: up to 256 KiB)
_WRITE_HIGH = 256 * 1024  # replies buffered in the transport before we wait for the client
_JUNK = frozenset({"NOOP", "VRFY", "ETRN", "RSET"})
_NOT_ERRORS = ("421", "452 4.5.3")  # replies that do not count towards the error limit
_LINES_KEPT = 64  # encoded reply lines a listener keeps (ListenerContext.lines)


@dataclass(slots=True, eq=False)
class ListenerContext:
    """What every session shares; passed in, nothing global."""

    committer: GroupCommitter
    on_commit: Callable[[Committed], None]  # after each durable commit to incoming/
    clock: Callable[[], float]
    counters: ClientCounters
    passwords: PasswordChecker
    observer: IntakeObserver = NULL_INTAKE  # intake metrics (qmgrd.listener.observer)
    gate: FlowGate = NULL_GATE  # fair admission's intake check (qmgrd.listener.flowgate)
    inflow: IntakeGate = OPEN_GATE  # regulator: in_flow_delay, 421 4.3.2 (listener.inflow)
    anvil: SharedCounts | None = None  # per-client counts of every listener process (limits)
    recycler: Recycler | None = None  # pooled inodes for temporary queue files (spool.recycle)
    room: SpoolRoom | None = None  # the spool's free space at MAIL (made on first use; room)
    # Bound once, shared by every session and message (a bind per session costs ~10 us).
    log: Any = field(default_factory=lambda: LineLog(get_logger("smtpd")))
    cleanup_log: Any = field(default_factory=lambda: LineLog(get_logger("cleanup")))
    # Reply lines as sent, by text: most replies are a few constant texts (Session.reply);
    # emptied when _LINES_KEPT are kept (the "queued as" texts are new every time).
    lines: dict[str, bytes] = field(default_factory=dict)


class Session(TransactionIO):
    """One client connection (see the module docstring)."""

    __slots__ = (
        "_closing",
        "_lines",
        "_ok",
        "_out",
        "_pending",
        "auth_failures",
        "chan",
        "client",
        "client_addr",
        "counts",
        "ctx",
        "dialogue",
        "errors",
        "junk",
        "last_verb",
        "log",
        "proto",
        "relay_ok",
        "sasl_method",
        "sasl_user",
        "settings",
        "tls",
    )

    def __init__(
        self,
        chan: Channel,
        settings: ListenerSettings,
        ctx: ListenerContext,
        client_addr: str,
    ) -> None:
        self.chan = chan
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
        self.counts = CommandCounts()  # for the disconnect line
        self.data_bytes = 0  # bytes of the current DATA so far (lost connection line)
        self.log = ctx.log
        self.tls: TlsFacts | None = None
        self._out: list[bytes] = []
        self._lines = ctx.lines
        self._closing = False
        self._ok = False  # the last reply queued was positive (2xx/3xx)
        self._pending: str | None = None  # the command being handled, not yet counted
        self._disk: asyncio.Future[None] | None = None  # the queue file's thread work

    # -- the adapter -----------------------------------------------------------------

    async def run(self) -> None:
        """Serve the connection until QUIT, an error limit, a timeout or the client's close."""
        self.log.info("connect", client=self.client)
        try:
            if self.chan.tls:  # wrapper mode: the handshake was done at accept
                self._tls_started()
            self.reply(f"220 {self.settings.banner}")
            # The command loop, here rather than in a coroutine of its own: one level less at
            # every resume of the session's task.
            while not self._closing:
                # next_event's steps, without a coroutine of its own per command
                event = self.proto.next_event()
                while event is None:
                    if self._send():
                        await self._drain()
                    data = await self.chan.read(_READ_SIZE, self.settings.smtpd_timeout)
                    if data:
                        self.proto.receive_data(data)
                    else:
                        self.proto.receive_eof()
                    event = self.proto.next_event()
                if type(event) is Command:  # the usual (a NamedTuple: no subclasses)
                    verb, arg = event
                    self.last_verb = verb if verb.isalpha() else "UNKNOWN"
                    handler = HANDLERS.get(verb)
                    if handler is None:
                        self.reply("502 5.5.2 Error: command not recognized")
                    else:
                        if verb in _JUNK:
                            self.junk += 1
                            if self.junk > self.settings.junk_command_limit:
                                self.errors += 1
                        self._pending = verb
                        await handler(self, arg)
                        self._pending = None
                    self.counts.record(verb if handler else "unknown", self._ok)
                elif isinstance(event, Closed):
                    self._lost()  # the client left without QUIT
                    break
                elif isinstance(event, LineTooLong):
                    self.reply("500 5.5.2 Error: command line too long")
                    self.counts.record("unknown", ok=False)
                if self.errors >= self.settings.hard_error_limit and not self._closing:
                    self.log.info("too many errors", after=self.last_verb, client=self.client)
                    self.reply(f"421 4.7.0 {self.settings.myhostname} Error: too many errors")
                    self._closing = True
            else:  # QUIT, 421: the last replies
                await self.flush()
        except TimeoutError:
            self.log.info("timeout", after=self.last_verb, client=self.client)
        except ssl.SSLError as exc:
            self.log.info("SSL_accept error", client=self.client, reason=exc.reason or str(exc))
        except (ConnectionError, OSError):
            self._lost()
        finally:
            try:
                if self.txn is not None:  # (no coroutine to make and run for nothing)
                    await self.abort_transaction()
            finally:
                self.chan.close()
                if self._pending is not None:  # cut off while handled: a failed command
                    self.counts.record(self._pending, ok=False)
                self.log.info("disconnect", client=self.client, commands=self.counts.as_field())

    def _lost(self) -> None:
        """Postfix's ``lost connection after CMD`` (with the bytes of a cut-off DATA)."""
        if self.last_verb in ("DATA", "BDAT"):
            self.log.info(
                "lost connection", after=self.last_verb, client=self.client, bytes=self.data_bytes
            )
        else:
            self.log.info("lost connection", after=self.last_verb, client=self.client)

    def close(self) -> None:
        """Disconnect now (listener shutdown); ``run`` then cleans up."""
        self.chan.abort()

    async def next_event(self) -> Event:
        """The protocol's next event, reading (and flushing replies) while it needs data."""
        while True:
            event = self.proto.next_event()
            if event is not None:
                return event
            if self._send():  # flush's steps without a coroutine of its own
                await self._drain()
            data = await self.chan.read(_READ_SIZE, self.settings.smtpd_timeout)
            if data:
                self.proto.receive_data(data)
            else:
                self.proto.receive_eof()

    def reply(self, text: str) -> None:
        """Queue one reply line (written at the next flush); 4xx/5xx count as errors and are
        reported to the observer (which counts refusals only: nothing else is)."""
        line = self._lines.get(text)
        if line is None:
            line = text.encode("utf-8", "surrogateescape") + b"\r\n"
            if len(self._lines) >= _LINES_KEPT:
                self._lines.clear()
            self._lines[text] = line
        self._out.append(line)
        code = text[0]
        if code in "45":
            self._ok = False
            if not text.startswith(_NOT_ERRORS):
                self.errors += 1
            self.ctx.observer.replied(text)
        else:
            self._ok = code in "23"

    def reply_lines(self, texts: tuple[str, ...], encoded: bytes) -> None:
        """Queue positive reply lines ``texts``, already encoded together (EHLO's; positive:
        nothing for the observer)."""
        self._ok = True
        self._out.append(encoded)

    async def flush(self) -> None:
        """Write the queued replies; wait for the client while too much is unread."""
        if self._send():
            await self._drain()

    def _send(self) -> bool:
        """Write the queued replies; True when the client must read before more is written."""
        out = self._out
        if not out:
            return self.chan.write_buffer_size() > _WRITE_HIGH
        buffered = self.chan.write(out[0] if len(out) == 1 else b"".join(out))
        out.clear()
        return buffered > _WRITE_HIGH

    async def _drain(self) -> None:
        async with asyncio.timeout(self.settings.smtpd_timeout):
            await self.chan.drain()

    def end_session(self) -> None:
        """Close after the queued replies are written (QUIT, 421)."""
        self._closing = True

    # -- the transaction -------------------------------------------------------------

    @property
    def auth_offered(self) -> bool:
        """AUTH is enabled and this channel may carry a clear-text password."""
        if self.settings.sasl_credentials is None:
            return False
        tls = self.settings.tls
        if self.tls is None and tls.starttls and not self.relay_ok:
            # The client could encrypt: clear text only for trusted local programs
            # (loopback and mynetworks), not for whatever else reaches a loopback address.
            return False
        return auth_allowed(
            # Postfix: level encrypt implies smtpd_tls_auth_only = yes
            self.client_addr, tls=self.tls is not None, auth_only=tls.auth_only or tls.required
        )

    @property
    def with_protocol(self) -> str:
        """The Received header's ``with`` keyword (RFC 3848): SMTP, ESMTP, ESMTPS, ESMTPSA, ..."""
        if not self.dialogue.extended:
            return "SMTP"
        return (
            "ESMTP"
            + ("S" if self.tls is not None else "")
            + ("A" if self.sasl_user is not None else "")
        )

    @property
    def starttls_offered(self) -> bool:
        """STARTTLS is configured and TLS is not active yet."""
        return self.settings.tls.starttls and self.tls is None

    def tls_required(self) -> bool:
        """Whether this command must wait for TLS (level encrypt, not yet encrypted)."""
        return self.settings.tls.required and self.tls is None

    async def starttls(self) -> None:
        """Reply 220, hand over to TLS and start the dialogue afresh (module docstring).

        A failed handshake raises (ssl.SSLError, ConnectionError, TimeoutError):
        the session ends, as Postfix's does.
        """
        context = self.settings.tls.context
        if context is None:
            raise InvariantError("starttls without a TLS context")
        self.reply("220 2.0.0 Ready to start TLS")
        await self.flush()
        await self.abort_transaction()
        self.chan = await self.chan.start_tls(context, self.settings.smtpd_timeout)
        self.proto = ServerProtocol()  # bytes pipelined before the handshake are gone
        self.dialogue = Dialogue()
        self.sasl_user = self.sasl_method = None
        self._tls_started()

    def _tls_started(self) -> None:
        self.tls = session_facts(self.chan.get_extra_info("ssl_object"))
        if self.tls is not None:
            self.log.info(
                "Anonymous TLS connection established",
                client=self.client,
                protocol=self.tls.protocol,
                cipher=self.tls.cipher,
                bits=self.tls.bits,
            )
