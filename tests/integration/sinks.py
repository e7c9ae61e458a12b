"""In-process SMTP sink servers for integration tests (aiosmtpd on the test's loop).

Usage::

    async with smtp_sink(SinkConfig(rcpt_replies={"bad@x": (550, "5.1.1 no")})) as sink:
        ...  # deliver to f"[{sink.host}]:{sink.port}"
    assert sink.messages[0].rcpt_tos == ["good@x"]
    assert sink.connections == 1

``SinkServer`` records every accepted message (envelope and raw content),
counts connections, current and peak concurrent sessions, and commands seen.
Tests wait for any of that on an event: ``await sink.wait_for(predicate, what)``
wakes at each change (``wait_messages``, ``wait_stalled`` for the usual ones).
``SinkConfig`` holds the knobs:

- ``delay``: seconds to wait before answering MAIL, RCPT and DATA (a slow
  server), each drawn uniformly from ``delay +/- delay_jitter`` (seeded by
  ``jitter_seed``: a real server's service time varies); ``stall``: commands
  (``"greeting"``, ``"EHLO"``, ``"MAIL"``, ``"RCPT"``, ``"DATA"``, ``"DOT"`` =
  end of data) at which the server stops
  answering until ``release()`` or the server stops (for timeout tests without
  sleeping in the test; ``stalled`` lists the stages sessions stopped at);
- ``rcpt_replies``: address → (code, text) replies to RCPT;
  ``mail_reply``, ``data_reply``: a fixed reply to MAIL / end of DATA;
- ``greeting``: the greeting line (``"421 busy"``, ``"554 go away"``);
- ``max_sessions``: beyond this many concurrent sessions, greet with 421 and
  close (decided when the connection arrives: connections still open, refused
  ones included until they close, are counted, as Postfix's anvil does);
- ``drop_in_data``: accept DATA with 354, read one line, drop the connection;
- ``tls_context``: offer STARTTLS with this server context (e.g. from
  ``trustme``); ``break_starttls``: answer 220 to STARTTLS, then hang up
  (a failed handshake);
- ``ehlo``: False makes EHLO fail with 502 (HELO only, no extensions);
- ``smtputf8``: advertise SMTPUTF8; ``size_limit``: the SIZE advertised.

Bind several sinks to the same port on different loopback addresses
(127.0.0.2, 127.0.0.3: Linux routes 127/8 to lo) with ``port=`` to model
several MX hosts of one domain.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiosmtpd.smtp import SMTP as _AioSMTP
from aiosmtpd.smtp import Envelope, Session

from qmgrd.delivery.agent import DeliveryRequest, Recipient
from qmgrd.delivery.content import BytesContent
from tests.support.waits import TIMEOUT, Changes


@dataclass(slots=True)
class SinkConfig:
    """Behaviour knobs of a sink server (see the module docstring)."""

    delay: float = 0.0
    delay_jitter: float = 0.0
    jitter_seed: int = 0
    stall: frozenset[str] = frozenset()
    rcpt_replies: dict[str, tuple[int, str]] = field(default_factory=dict)
    mail_reply: tuple[int, str] | None = None
    data_reply: tuple[int, str] | None = None
    greeting: str | None = None
    max_sessions: int = 0
    drop_in_data: bool = False
    tls_context: ssl.SSLContext | None = None
    break_starttls: bool = False
    ehlo: bool = True
    smtputf8: bool = True
    size_limit: int | None = 33554432


@dataclass(frozen=True, slots=True)
class ReceivedMessage:
    """One accepted message as the sink saw it."""

    mail_from: str
    rcpt_tos: list[str]
    content: bytes
    mail_options: list[str]
    rcpt_options: list[str]
    peer_tls: bool
    received_at: float = 0.0  # the loop's clock when the end of data was accepted


class _Handler:
    """aiosmtpd handler hooks: per-recipient replies, delays, stalls, recording."""

    def __init__(self, server: SinkServer) -> None:
        self.server = server

    async def handle_MAIL(
        self, smtp: Any, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        await self.server._pause("MAIL")
        cfg = self.server.config
        if cfg.mail_reply is not None:
            return f"{cfg.mail_reply[0]} {cfg.mail_reply[1]}"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 2.1.0 Ok"

    async def handle_RCPT(
        self, smtp: Any, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        await self.server._pause("RCPT")
        reply = self.server.config.rcpt_replies.get(address)
        if reply is not None:
            return f"{reply[0]} {reply[1]}"
        envelope.rcpt_tos.append(address)
        envelope.rcpt_options.extend(options)
        return "250 2.1.5 Ok"

    async def handle_DATA(self, smtp: Any, session: Session, envelope: Envelope) -> str:
        await self.server._pause("DOT")
        cfg = self.server.config
        if cfg.data_reply is not None:
            return f"{cfg.data_reply[0]} {cfg.data_reply[1]}"
        content = envelope.original_content or envelope.content or b""
        assert isinstance(content, bytes)
        self.server.messages.append(
            ReceivedMessage(
                mail_from=envelope.mail_from or "",
                rcpt_tos=list(envelope.rcpt_tos),
                content=content,
                mail_options=list(envelope.mail_options),
                rcpt_options=list(envelope.rcpt_options),
                peer_tls=session.ssl is not None,
                received_at=asyncio.get_running_loop().time(),
            )
        )
        self.server.changes.notify()
        return f"250 2.0.0 Ok: queued as S{len(self.server.messages)}"


class _SinkSMTP(_AioSMTP):
    """aiosmtpd's protocol with connection accounting and failure knobs."""

    def __init__(self, server: SinkServer, **kwargs: Any) -> None:
        super().__init__(_Handler(server), **kwargs)
        self._sink = server
        self._counted = False
        self._over_limit = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self._counted:
            self._counted = True
            self._sink._protocols.add(self)
            self._sink.connections += 1
            self._sink.active += 1
            self._sink.peak = max(self._sink.peak, self._sink.active)
            # Decide admission in arrival order, as an anvil-style counter does: of six
            # connections arriving together the first five are admitted, the sixth refused.
            limit = self._sink.config.max_sessions
            self._over_limit = bool(limit) and self._sink.active > limit
            self._sink.changes.notify()
        super().connection_made(transport)

    def connection_lost(self, error: Exception | None) -> None:
        if self._counted:
            self._counted = False
            self._sink.active -= 1
            self._sink._protocols.discard(self)
            self._sink.changes.notify()
        super().connection_lost(error)

    def _hang_up(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def _handle_client(self) -> None:
        cfg = self._sink.config
        if self._over_limit:
            self._sink.refused += 1
            await self.push("421 4.7.0 Too many concurrent sessions, try again later")
            self._hang_up()
            return
        if cfg.greeting is not None:
            await self.push(cfg.greeting)
            if not cfg.greeting.startswith("2"):
                self._hang_up()
                return
        await self._sink._pause("greeting")
        await super()._handle_client()

    async def push(self, status: Any) -> None:
        # The greeting comes from _handle_client; swallow aiosmtpd's own when we sent one.
        if (
            self._sink.config.greeting is not None
            and isinstance(status, str)
            and status.startswith("220 ")
            and "Ready to start TLS" not in status
        ):
            return
        await super().push(status)

    async def smtp_EHLO(self, hostname: str) -> None:
        self._sink._command("EHLO")
        await self._sink._pause("EHLO")
        if not self._sink.config.ehlo:
            await self.push("502 5.5.2 Error: command not recognized")
            return
        await super().smtp_EHLO(hostname)

    async def smtp_HELO(self, hostname: str) -> None:
        self._sink._command("HELO")
        await super().smtp_HELO(hostname)

    async def smtp_RSET(self, arg: str) -> None:
        self._sink._command("RSET")
        await super().smtp_RSET(arg)

    async def smtp_QUIT(self, arg: str) -> None:
        self._sink._command("QUIT")
        await super().smtp_QUIT(arg)

    async def smtp_STARTTLS(self, arg: str) -> None:
        self._sink._command("STARTTLS")
        if self._sink.config.break_starttls:
            await self.push("220 Ready to start TLS")
            self._hang_up()
            return
        await super().smtp_STARTTLS(arg)

    async def smtp_DATA(self, arg: str) -> None:
        self._sink._command("DATA")
        await self._sink._pause("DATA")
        if self._sink.config.drop_in_data and self.envelope is not None and self.envelope.rcpt_tos:
            await self.push("354 End data with <CR><LF>.<CR><LF>")
            await self._reader.readline()
            self._sink.dropped += 1
            self._hang_up()
            return
        await super().smtp_DATA(arg)


class SinkServer:
    """An SMTP sink on ``host``:``port`` (port 0 = let the OS choose)."""

    def __init__(
        self, config: SinkConfig | None = None, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        self.config = config or SinkConfig()
        self.host = host
        self.port = port
        self.messages: list[ReceivedMessage] = []
        self.commands: list[str] = []
        self.connections = 0
        self.active = 0
        self.peak = 0
        self.refused = 0
        self.dropped = 0
        self.stalled: list[str] = []  # stages at which a session stopped to wait for release()
        self.changes = Changes()
        self._server: asyncio.Server | None = None
        self._protocols: set[_SinkSMTP] = set()
        self._release = asyncio.Event()
        self._random = random.Random(self.config.jitter_seed)

    @property
    def nexthop(self) -> str:
        """``[host]:port``: deliver here without an MX lookup."""
        return f"[{self.host}]:{self.port}"

    def release(self) -> None:
        """Let stalled commands proceed (and every later one)."""
        self._release.set()

    async def wait_for(
        self, predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT
    ) -> None:
        """Return once ``predicate()`` holds, re-checked at each change the sink sees (bounded).

        Changes: a connection opened or closed, a command, a stall reached, a message accepted.
        """
        await self.changes.wait_for(predicate, what, timeout)

    async def wait_messages(self, count: int, timeout: float = TIMEOUT) -> None:
        """Return once ``count`` messages were accepted (bounded)."""
        await self.wait_for(lambda: len(self.messages) >= count, f"{count} messages", timeout)

    async def wait_stalled(self, stage: str, count: int = 1, timeout: float = TIMEOUT) -> None:
        """Return once ``count`` sessions stopped at ``stage`` waiting for ``release()``."""
        await self.wait_for(
            lambda: self.stalled.count(stage) >= count, f"{count} sessions stalled at {stage}",
            timeout,
        )

    def _command(self, name: str) -> None:
        self.commands.append(name)
        self.changes.notify()

    async def _pause(self, stage: str) -> None:
        cfg = self.config
        if cfg.delay and stage in ("MAIL", "RCPT", "DOT"):
            # A slow server: the delay is the behaviour under test, not a wait for an event.
            delay = cfg.delay
            if cfg.delay_jitter:
                delay += self._random.uniform(-cfg.delay_jitter, cfg.delay_jitter)
            await asyncio.sleep(max(0.0, delay))
        if stage in self.config.stall and not self._release.is_set():
            self.stalled.append(stage)
            self.changes.notify()
            await self._release.wait()

    def _protocol(self) -> _SinkSMTP:
        cfg = self.config
        return _SinkSMTP(
            self,
            hostname="sink.test",
            ident="qmgrd-test-sink",
            tls_context=cfg.tls_context,
            enable_SMTPUTF8=cfg.smtputf8,
            data_size_limit=cfg.size_limit,
            loop=asyncio.get_running_loop(),
        )

    async def start(self) -> None:
        """Listen; ``self.port`` becomes the bound port."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, release stalls and close every connection."""
        self.release()
        if self._server is not None:
            self._server.close()
            for protocol in list(self._protocols):
                if protocol.transport is not None:
                    protocol.transport.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None


@contextlib.asynccontextmanager
async def smtp_sink(
    config: SinkConfig | None = None, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[SinkServer]:
    """A started ``SinkServer``, stopped on exit."""
    server = SinkServer(config, host, port)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


MESSAGE = (
    b"From: a@example.org\r\nTo: b@example.com\r\nSubject: test\r\n\r\nHello.\r\n.dot line\r\n"
)


def make_request(
    nexthop: str,
    recipients: list[str],
    *,
    content: bytes = MESSAGE,
    sender: str = "a@example.org",
    queue_id: str = "TESTQ1",
    **kwargs: Any,
) -> DeliveryRequest:
    """A ``DeliveryRequest`` for tests, with in-memory content."""
    return DeliveryRequest(
        queue_id=queue_id,
        transport="smtp",
        nexthop=nexthop,
        sender=sender,
        recipients=tuple(Recipient(addr, offset=i * 100) for i, addr in enumerate(recipients)),
        content=BytesContent(content),
        **kwargs,
    )
