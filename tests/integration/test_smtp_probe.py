"""The RSET probe of a cached session, pipelined with the envelope when the server offers it.

A session taken from the connection cache is probed with RSET before reuse (as
Postfix does). With PIPELINING the RSET rides at the head of the MAIL/RCPT/DATA
group, in the same write; a session that fails the probe (a reply other than
250, or a connection the server closed meanwhile) is closed without sending
any content, nothing is recorded against the recipients, and the delivery goes
on over a new connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from qmgrd.delivery.agent import DeliveryResult, Outcome
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request
from tests.support.scripted import FAST, Handler, scripted

BOUND = 30.0


@dataclass
class _Server:
    """A PIPELINING server that takes any number of messages per connection."""

    bad_rset: set[int] = field(default_factory=set)  # connections whose RSET gets 554
    close_after_message: set[int] = field(default_factory=set)  # hang up after the first "."
    reads: list[tuple[int, bytes]] = field(default_factory=list)  # (connection, bytes read)
    messages: list[int] = field(default_factory=list)  # the connection of each message taken
    connections: int = 0

    def handler(self) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            conn = self.connections
            writer.write(b"220 mx.test ESMTP\r\n")
            await writer.drain()
            in_data = False
            async for line in self._lines(conn, reader):
                if in_data:
                    if line == b".":
                        in_data = False
                        self.messages.append(conn)
                        writer.write(b"250 2.0.0 queued\r\n")
                        await writer.drain()
                        if conn in self.close_after_message:
                            return
                    continue
                verb = line[:4].upper()
                if verb == b"EHLO":
                    writer.write(b"250-mx.test\r\n250 PIPELINING\r\n")
                elif verb == b"RSET":
                    bad = conn in self.bad_rset
                    writer.write(b"554 5.5.1 bad state\r\n" if bad else b"250 ok\r\n")
                elif verb == b"DATA":
                    in_data = True
                    writer.write(b"354 go\r\n")
                elif verb == b"QUIT":
                    writer.write(b"221 bye\r\n")
                    await writer.drain()
                    return
                else:
                    writer.write(b"250 ok\r\n")
                await writer.drain()

        return handle

    async def _lines(self, conn: int, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        buf = b""
        while True:
            while b"\n" not in buf:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                self.reads.append((conn, chunk))
                buf += chunk
            line, buf = buf.split(b"\n", 1)
            yield line.rstrip(b"\r")


async def _two_deliveries(server: _Server) -> tuple[SmtpAgent, list[DeliveryResult]]:
    async with scripted(server.handler()) as srv:
        settings = dataclasses.replace(FAST, connection_cache_destinations=(srv.nexthop,))
        agent = SmtpAgent(settings)
        results = []
        try:
            for rcpt in ("a@dst.test", "b@dst.test"):
                request = make_request(srv.nexthop, [rcpt])
                results.append(await asyncio.wait_for(agent.deliver(request), BOUND))
        finally:
            await agent.close()
    return agent, results


async def test_the_probe_of_a_cached_session_rides_with_the_envelope() -> None:
    """The second delivery reuses the session: RSET, MAIL, RCPT and DATA arrive in one read."""
    server = _Server()
    agent, results = await _two_deliveries(server)
    assert [r.recipients[0].outcome for r in results] == [Outcome.SENT, Outcome.SENT]
    assert server.connections == 1 and agent.stats.reused == 1
    groups = [data for _conn, data in server.reads if data.startswith(b"RSET")]
    assert len(groups) == 1, server.reads
    assert groups[0].split(b"\r\n")[:-1] == [
        b"RSET",
        b"MAIL FROM:<a@example.org>",
        b"RCPT TO:<b@dst.test>",
        b"DATA",
    ]
    assert server.messages == [1, 1]


async def test_a_refused_probe_sends_no_content_and_a_new_session_delivers() -> None:
    """RSET answered 554 (the rest of the group accepted, even DATA): the cached session is
    dropped before any content, and the message goes over a new connection, once."""
    server = _Server(bad_rset={1})
    agent, results = await _two_deliveries(server)
    second = results[1]
    assert (second.recipients[0].outcome, second.hop) == (Outcome.SENT, None)
    assert second.recipients[0].reply == "250 2.0.0 queued"
    assert server.connections == 2 and agent.stats.reused == 0
    assert server.messages == [1, 2]  # the first connection never got the second message


async def test_a_session_the_server_closed_is_replaced() -> None:
    """The server hung up on the idle cached session: the probe fails, a new session delivers."""
    server = _Server(close_after_message={1})
    agent, results = await _two_deliveries(server)
    second = results[1]
    assert (second.recipients[0].outcome, second.hop) == (Outcome.SENT, None)
    assert server.connections == 2 and agent.stats.reused == 0
    assert server.messages == [1, 2]
