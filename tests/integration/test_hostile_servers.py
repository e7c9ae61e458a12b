"""The SMTP agent against hostile or broken servers and DNS, scripted on raw sockets.

Each case is a tiny asyncio server on 127.0.0.1 (port 0) that misbehaves in
one way. The agent must turn every misbehaviour into a deferral or a bounce
with a clear reason and the right hop status (negative feedback only for
site-level failures), within its configured timeouts, and leave no task or
file descriptor behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

import dns.message
import dns.rdataclass
import dns.rdatatype
import dns.rrset
import pytest

from qmgrd.delivery.agent import Outcome
from tests.integration.dnsserver import DnsResponder, dns_responder
from tests.support.scripted import (
    FAST,
    Handler,
    deliver_once,
    play_until,
    read_line,
    scripted,
    wait_forever,
)

# --------------------------------------------------------------------------- scripts


async def garbage_greeting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HELLO I AM NOT SMTP\r\n\x00\xff\xfe garbage\r\n")
    await writer.drain()
    await wait_forever()


async def endless_multiline(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    await read_line(reader)  # EHLO
    while True:  # continuation lines, never a last line
        writer.write(b"250-" + b"x" * 1000 + b"\r\n")
        await writer.drain()


async def huge_reply(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    await play_until(reader, writer, b"RCPT")
    writer.write(b"550 5.1.1 " + b"u" * 100_000 + b"\r\n")
    await writer.drain()
    await play_until(reader, writer, b"NEVER")


async def long_reply_600(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 " + b"g" * 600 + b"\r\n")  # over RFC 5321's 512 octets, still sane
    await play_until(reader, writer, b"DATA")
    writer.write(b"354 go\r\n")
    await writer.drain()
    while (await reader.readline()).rstrip(b"\r\n") != b".":
        pass
    writer.write(b"250 2.0.0 queued " + b"q" * 600 + b"\r\n")
    await writer.drain()
    await play_until(reader, writer, b"NEVER")


async def silent_after_data(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    await play_until(reader, writer, b"DATA")
    writer.write(b"354 go\r\n")
    await writer.drain()
    while await reader.read(65536):  # swallow the body and the final dot, never answer
        pass
    await wait_forever()


async def close_after_354(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    await play_until(reader, writer, b"DATA")
    writer.write(b"354 go\r\n")
    await writer.drain()
    writer.close()


async def silent_greeting(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await wait_forever()


async def bad_starttls(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    while True:
        cmd = await read_line(reader)
        if cmd.startswith(b"EHLO"):
            writer.write(b"250-mx.test\r\n250 STARTTLS\r\n")
        elif cmd == b"STARTTLS":
            writer.write(b"220 2.0.0 go ahead\r\n")
            await writer.drain()
            await reader.read(4096)  # the ClientHello
            writer.write(b"this is not a TLS record\r\n" * 10)
            await writer.drain()
            writer.close()
            return
        else:
            writer.write(b"502 no\r\n")
        await writer.drain()


@dataclass(frozen=True)
class Case:
    handler: Handler
    outcome: Outcome
    dsn_class: str
    reason: str  # a fragment the reply must contain
    hop: bool  # negative feedback expected


CASES = {
    "garbage greeting": Case(
        garbage_greeting, Outcome.DEFERRED, "4", "initial server greeting", True
    ),
    "silent greeting": Case(
        silent_greeting, Outcome.DEFERRED, "4", "timed out while receiving the initial", True
    ),
    "endless multi-line reply": Case(
        endless_multiline, Outcome.DEFERRED, "4", "sending EHLO", True
    ),
    "100 kB reply": Case(huge_reply, Outcome.DEFERRED, "4", "127.0.0.1", True),
    "silent after DATA": Case(
        silent_after_data, Outcome.DEFERRED, "4", "timed out while sending end of data", True
    ),
    "close after 354": Case(
        close_after_354, Outcome.DEFERRED, "4", "lost connection with", True
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(CASES))
async def test_broken_server_becomes_a_clear_deferral(name: str, no_leaks: None) -> None:
    """Each misbehaviour ends in the expected outcome, DSN class, reason text and hop status."""
    case = CASES[name]
    async with scripted(case.handler) as srv:
        result = await deliver_once(srv.nexthop)
    (r,) = result.recipients
    assert r.outcome is case.outcome, r
    assert r.dsn.startswith(case.dsn_class), r
    assert case.reason in r.reply, r.reply
    assert len(r.reply) < 2000, "the reason must stay a readable one-liner"
    assert "\n" not in r.reply and "\r" not in r.reply
    assert (result.hop is not None) == case.hop, result.hop
    if result.hop is not None:
        assert result.hop.dsn.startswith("4") and result.hop.reason


async def test_reply_over_512_bytes_is_tolerated(no_leaks: None) -> None:
    """600-byte greeting and final reply (over RFC 5321's 512) still deliver, positively."""
    async with scripted(long_reply_600) as srv:
        result = await deliver_once(srv.nexthop)
    (r,) = result.recipients
    assert r.outcome is Outcome.SENT, r
    assert result.hop is None


async def test_tls_handshake_failure_defers_when_tls_is_required(no_leaks: None) -> None:
    """Garbage after STARTTLS with level encrypt: a 4.7.x deferral naming TLS, hop status set."""
    settings = dataclasses.replace(FAST, tls_security_level="encrypt")
    async with scripted(bad_starttls) as srv:
        result = await deliver_once(srv.nexthop, settings)
    (r,) = result.recipients
    assert r.outcome is Outcome.DEFERRED
    assert r.dsn.startswith("4.7."), r
    assert "TLS" in r.reply
    assert result.hop is not None


async def test_tls_handshake_failure_falls_back_to_plaintext_with_may(no_leaks: None) -> None:
    """With level may, a failed handshake is retried in plaintext on a new connection."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if srv.connections == 1:
            await bad_starttls(reader, writer)
            return
        writer.write(b"220 mx.test ESMTP\r\n")
        await play_until(reader, writer, b"DATA")
        writer.write(b"354 go\r\n")
        await writer.drain()
        while (await reader.readline()).rstrip(b"\r\n") != b".":
            pass
        writer.write(b"250 2.0.0 plaintext ok\r\n")
        await writer.drain()
        await play_until(reader, writer, b"NEVER")

    settings = dataclasses.replace(FAST, tls_security_level="may")
    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, settings)
    (r,) = result.recipients
    assert r.outcome is Outcome.SENT, r
    assert srv.connections == 2


# ------------------------------------------------------------------------------ DNS


class CnameResponder(DnsResponder):
    """Answers every query for a name with a CNAME record with just that CNAME (loops allowed)."""

    def answer(self, query: dns.message.Message) -> dns.message.Message | None:
        question = query.question[0] if query.question else None
        if question is not None:
            name = question.name.to_text().lower().rstrip(".")
            target = self.records.get((name, "CNAME"))
            if target:
                self.queries.append((name, dns.rdatatype.to_text(question.rdtype)))
                response = dns.message.make_response(query)
                response.answer.append(
                    dns.rrset.from_text_list(
                        question.name, 60, dns.rdataclass.IN, dns.rdatatype.CNAME, target
                    )
                )
                return response
        return super().answer(query)


@contextlib.asynccontextmanager
async def cname_responder(records: dict[tuple[str, str], list[str]]) -> AsyncIterator[DnsResponder]:
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: CnameResponder(records), local_addr=("127.0.0.1", 0)
    )
    protocol.port = transport.get_extra_info("sockname")[1]
    try:
        yield protocol
    finally:
        transport.close()


async def test_cname_loop_is_a_clear_dns_failure(no_leaks: None) -> None:
    """An MX/A CNAME loop (a -> b -> a) ends quickly in a 5.4.4 bounce naming the domain."""
    records = {("loop.test", "CNAME"): ["loop2.test."], ("loop2.test", "CNAME"): ["loop.test."]}
    async with cname_responder(records) as dns_server:
        settings = dataclasses.replace(FAST, dns_nameservers=(dns_server.nameserver,))
        result = await deliver_once("loop.test", settings)
        assert len(dns_server.queries) < 20  # no endless chasing
    (r,) = result.recipients
    # Like Postfix (dns_lookup: "Name server loop" is DNS_NOTFOUND): a permanent 5.4.4 for the
    # recipient, no negative feedback for the transport.
    assert (r.outcome, r.dsn) == (Outcome.BOUNCED, "5.4.4"), r
    assert "loop.test" in r.reply and "Name service error" in r.reply, r.reply
    assert r.relay == "none" and result.hop is None


async def test_thousands_of_mx_records_are_bounded(no_leaks: None) -> None:
    """2000 MX hosts: only a bounded number are resolved and tried, then a clean deferral."""
    records: dict[tuple[str, str], list[str]] = {
        ("many.test", "MX"): [f"{i % 7} mx{i}.many.test." for i in range(2000)]
    }
    # Every MX host resolves to a closed port on 127.0.0.1 (refused at once).
    closed = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = closed.sockets[0].getsockname()[1]
    closed.close()
    await closed.wait_closed()
    for i in range(2000):
        records[(f"mx{i}.many.test", "A")] = ["127.0.0.1"]
    async with dns_responder(records) as dns_server:
        settings = dataclasses.replace(FAST, dns_nameservers=(dns_server.nameserver,))
        result = await deliver_once(f"many.test:{port}", settings)
        looked_up = len(dns_server.queries)
    (r,) = result.recipients
    assert r.outcome is Outcome.DEFERRED, r
    assert "Connection refused" in r.reply, r.reply
    assert result.hop is not None
    # MX, then A and AAAA of just enough hosts for smtp_mx_address_limit addresses.
    assert looked_up <= 1 + 2 * FAST.mx_address_limit, f"{looked_up} DNS queries for one delivery"
