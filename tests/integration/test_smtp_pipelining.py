"""The SMTP client's pipelining (RFC 2920) and its bounds, against scripted servers on 127.0.0.1.

A server that offers PIPELINING gets MAIL FROM, every RCPT TO and DATA in one
write and its replies are matched in order; one that does not gets one
command per reply. Hostile replies inside a group (endless continuation
lines, huge lines, no line end, a slow drip, a dropped line) end in a clear
deferral within the limits and timeouts, never a hang; replies injected in clear text
behind the 220 to STARTTLS are never read. A session that is not kept for the cache
sends QUIT behind the end of data, in the same write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ssl
from collections.abc import Awaitable, Callable

import pytest

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request
from tests.support.scripted import (
    FAST,
    Handler,
    Scripted,
    deliver_once,
    read_line,
    scripted,
    wait_forever,
)
from tests.support.waits import TIMEOUT

RCPTS = ("a@dst.test", "b@dst.test", "c@dst.test", "d@dst.test")
EHLO_PIPELINING = b"250-mx.test\r\n250-PIPELINING\r\n250 8BITMIME\r\n"
EHLO_PLAIN = b"250-mx.test\r\n250 8BITMIME\r\n"
SLOW = 10.0  # timeouts a test must not reach: the limit, not the clock, ends it


def _relay(srv: Scripted) -> str:
    return f"127.0.0.1[127.0.0.1]:{srv.port}"


async def _greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ehlo: bytes) -> None:
    writer.write(b"220 mx.test ESMTP\r\n")
    await writer.drain()
    assert (await read_line(reader)).startswith(b"EHLO")
    writer.write(ehlo)
    await writer.drain()


async def _finish(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Take the message after 354, accept it, then answer QUIT."""
    while (await reader.readline()).rstrip(b"\r\n") != b".":
        pass
    writer.write(b"250 2.0.0 queued\r\n")
    await writer.drain()
    if (await read_line(reader)).startswith(b"QUIT"):
        writer.write(b"221 bye\r\n")
        await writer.drain()


def _group_reader(reads: list[bytes]) -> Callable[[asyncio.StreamReader], Awaitable[bytes]]:
    async def read_group(reader: asyncio.StreamReader) -> bytes:
        """Read (recording each read) until the DATA line, answering nothing meanwhile."""
        got = b""
        while not got.endswith(b"DATA\r\n"):
            chunk = await reader.read(65536)
            if not chunk:
                raise ConnectionResetError("client went away")
            reads.append(chunk)
            got += chunk
        return got

    return read_group


async def test_pipelined_group_is_one_write() -> None:
    """With PIPELINING offered, MAIL..DATA arrive together before any reply is sent."""
    reads: list[bytes] = []
    read_group = _group_reader(reads)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PIPELINING)
        await read_group(reader)  # no reply until DATA is in: a client that waited
        # for the MAIL reply would stall here until its timeout
        writer.write(b"250 2.1.0 ok\r\n" + b"250 2.1.5 ok\r\n" * len(RCPTS) + b"354 go\r\n")
        await writer.drain()
        await _finish(reader, writer)

    settings = dataclasses.replace(FAST, mail_timeout=SLOW, rcpt_timeout=SLOW)
    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, settings, RCPTS)
    assert [r.outcome for r in result.recipients] == [Outcome.SENT] * len(RCPTS)
    assert len(reads) == 1, reads  # one write, one segment on loopback
    lines = reads[0].split(b"\r\n")[:-1]
    assert lines[0].startswith(b"MAIL FROM:<a@example.org>")
    assert lines[1:-1] == [f"RCPT TO:<{r}>".encode() for r in RCPTS]
    assert lines[-1] == b"DATA"
    assert result.hop is None


async def test_without_pipelining_one_command_per_reply() -> None:
    """Without PIPELINING every read holds exactly one command: the client waits each reply."""
    reads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PLAIN)
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            reads.append(chunk)
            if chunk == b"DATA\r\n":
                writer.write(b"354 go\r\n")
                await writer.drain()
                await _finish(reader, writer)
                return
            writer.write(b"250 ok\r\n")
            await writer.drain()

    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS)
    assert [r.outcome for r in result.recipients] == [Outcome.SENT] * len(RCPTS)
    assert [chunk.count(b"\r\n") for chunk in reads] == [1] * (len(RCPTS) + 2), reads
    assert reads[0].startswith(b"MAIL FROM:") and reads[-1] == b"DATA\r\n"


def _pipelined(answer: Callable[[int], bytes], *, then: Handler | None = None) -> Handler:
    """A PIPELINING server answering the group's commands by position (0 = MAIL)."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PIPELINING)
        n = 0
        while True:
            cmd = await read_line(reader)
            writer.write(answer(n))
            await writer.drain()
            n += 1
            if cmd == b"DATA":
                break
        if then is not None:
            await then(reader, writer)

    return handler


async def test_pipelined_rcpt_refusals_land_on_their_recipients() -> None:
    """4xx and 5xx RCPT replies in a group defer and bounce exactly their recipients."""
    replies = {2: b"450 4.2.0 mailbox busy\r\n", 3: b"550 5.1.1 no such user\r\n"}

    def answer(n: int) -> bytes:
        return b"354 go\r\n" if n == 1 + len(RCPTS) else replies.get(n, b"250 2.1.5 ok\r\n")

    async with scripted(_pipelined(answer, then=_finish)) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS)
    got = [(r.recipient.address, r.outcome, r.dsn) for r in result.recipients]
    assert got == [
        ("a@dst.test", Outcome.SENT, "2.0.0"),
        ("b@dst.test", Outcome.DEFERRED, "4.2.0"),
        ("c@dst.test", Outcome.BOUNCED, "5.1.1"),
        ("d@dst.test", Outcome.SENT, "2.0.0"),
    ]
    relay = _relay(srv)
    assert result.recipients[1].reply == (
        f"host {relay} said: 450 4.2.0 mailbox busy (in reply to RCPT TO command)"
    )
    assert result.recipients[2].reply == (
        f"host {relay} said: 550 5.1.1 no such user (in reply to RCPT TO command)"
    )
    assert result.hop is None  # recipient replies are never negative feedback


async def test_pipelined_no_recipient_accepted_ends_a_354_with_a_dot_and_resets() -> None:
    """Every RCPT refused but DATA answered 354: "." ends the empty message, then RSET."""
    seen: list[bytes] = []

    def answer(n: int) -> bytes:
        if n == 0:
            return b"250 ok\r\n"
        return b"354 go\r\n" if n == 1 + len(RCPTS) else b"550 5.1.1 no\r\n"

    quit_read = asyncio.Event()

    async def then(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for reply in (b"554 5.5.1 no valid recipients\r\n", b"250 reset\r\n", b"221 bye\r\n"):
            seen.append(await read_line(reader))
            if seen[-1] == b"QUIT":
                quit_read.set()  # the client need not wait for the 221 (smtp_skip_quit_response)
            writer.write(reply)
            await writer.drain()

    async with scripted(_pipelined(answer, then=then)) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS)
        await asyncio.wait_for(quit_read.wait(), TIMEOUT)
    assert {r.outcome for r in result.recipients} == {Outcome.BOUNCED}
    assert seen == [b".", b"RSET", b"QUIT"]


async def test_line_dropped_mid_group_defers_everything_with_a_hop_status() -> None:
    """The server answers MAIL and one RCPT, then drops the line: 4.4.2, hop status."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PIPELINING)
        await _group_reader([])(reader)
        writer.write(b"250 ok\r\n250 ok\r\n")
        await writer.drain()
        writer.close()

    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS)
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.DEFERRED, "4.4.2")}
    assert f"lost connection with {_relay(srv)} while sending RCPT TO" in (
        result.recipients[0].reply
    )
    assert result.hop is not None and result.hop.dsn == "4.4.2"


async def test_pipelined_421_is_a_site_failure() -> None:
    """A 421 to a RCPT in the group defers every recipient with a hop status."""

    def answer(n: int) -> bytes:
        return b"421 4.3.2 shutting down\r\n" if n == 2 else b"250 ok\r\n"

    async with scripted(_pipelined(answer, then=None)) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS)
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.DEFERRED, "4.3.2")}
    assert "421 4.3.2 shutting down (in reply to RCPT TO command)" in result.recipients[0].reply
    assert result.hop is not None


async def _endless(writer: asyncio.StreamWriter) -> None:
    for _ in range(10_000):  # far past the line count limit; bounded for the test
        writer.write(b"250-" + b"x" * 100 + b"\r\n")
        await writer.drain()
    await wait_forever()


async def _huge_no_newline(writer: asyncio.StreamWriter) -> None:
    writer.write(b"250 " + b"x" * 100_000)
    await writer.drain()
    await wait_forever()


async def _drip(writer: asyncio.StreamWriter) -> None:
    for _ in range(2000):  # one byte at a time, never a line end: 40 s, past deliver_once's 30
        writer.write(b"2")
        await writer.drain()
        await asyncio.sleep(0.02)  # the hostile server's pace, not a wait for the test
    await wait_forever()


HOSTILE = {
    "endless continuation lines": (_endless, "reply longer than 200 lines", SLOW),
    "a 100 kB line without CRLF": (_huge_no_newline, "reply line longer than 8192 bytes", SLOW),
    "slow drip": (_drip, "timed out while sending MAIL FROM", 0.5),
}


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_hostile_reply_in_a_group_is_bounded(name: str, no_leaks: None) -> None:
    """A hostile MAIL reply ends in a 4.4.2 deferral by a limit or ``smtp_mail_timeout``."""
    misbehave, reason, mail_timeout = HOSTILE[name]

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PIPELINING)
        await _group_reader([])(reader)
        await misbehave(writer)

    settings = dataclasses.replace(FAST, mail_timeout=mail_timeout)
    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, settings, RCPTS)
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.DEFERRED, "4.4.2")}
    (reply,) = {r.reply for r in result.recipients}
    assert reason in reply and "sending MAIL FROM" in reply, reply
    assert len(reply) < 300
    assert result.hop is not None


async def test_each_reply_in_a_group_has_its_commands_timeout() -> None:
    """MAIL and RCPT answered, DATA never: ``smtp_data_init_timeout`` ends it, not the others."""

    def answer(n: int) -> bytes:
        return b"250 ok\r\n" if n <= len(RCPTS) else b""

    async def then(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await wait_forever()

    settings = dataclasses.replace(
        FAST, mail_timeout=SLOW, rcpt_timeout=SLOW, data_init_timeout=0.3
    )
    async with scripted(_pipelined(answer, then=then)) as srv:
        result = await deliver_once(srv.nexthop, settings, RCPTS)
    assert {r.outcome for r in result.recipients} == {Outcome.DEFERRED}
    assert f"conversation with {_relay(srv)} timed out while sending DATA" == (
        result.recipients[0].reply
    )


async def test_replies_injected_before_the_tls_handshake_are_dropped(
    server_tls: ssl.SSLContext,
) -> None:
    """Clear-text replies sent behind the 220 to STARTTLS are never read as TLS replies.

    The client-side twin of CVE-2011-0411: the server answers STARTTLS with its
    220 and, in the same write, replies to commands the client has not sent yet.
    Read after the handshake, they would answer EHLO, MAIL and RCPT with the
    attacker's text; dropped, the conversation over TLS stays in step.
    """
    commands: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, b"250-mx.test\r\n250 STARTTLS\r\n")
        assert await read_line(reader) == b"STARTTLS"
        writer.write(b"220 go ahead\r\n250 injected ehlo\r\n550 5.7.1 injected refusal\r\n")
        await writer.drain()
        await writer.start_tls(server_tls)
        while True:
            cmd = await read_line(reader)
            commands.append(cmd.split(b":")[0])
            if cmd.startswith(b"EHLO"):
                writer.write(b"250 mx.test\r\n")
            elif cmd == b"DATA":
                writer.write(b"354 go\r\n")
                await writer.drain()
                await _finish(reader, writer)
                return
            else:
                writer.write(b"250 2.0.0 ok\r\n")
            await writer.drain()

    settings = dataclasses.replace(FAST, tls_security_level="encrypt", starttls_timeout=5.0)
    async with scripted(handler) as srv:
        result = await deliver_once(srv.nexthop, settings, RCPTS[:1])
    (r,) = result.recipients
    assert (r.outcome, r.reply) == (Outcome.SENT, "250 2.0.0 queued"), r
    assert commands == [b"EHLO CLIENT.TEST", b"MAIL FROM", b"RCPT TO", b"DATA"]


def _recording_tail(
    tails: list[bytes], commands: list[bytes], quit_read: asyncio.Event | None = None
) -> Handler:
    """A PIPELINING server recording the read that ends the message and every later command."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _greet(reader, writer, EHLO_PIPELINING)
        await _group_reader([])(reader)
        writer.write(b"250 ok\r\n250 ok\r\n354 go\r\n")
        await writer.drain()
        got = b""
        while b"\r\n.\r\n" not in got:
            chunk = await reader.read(65536)
            if not chunk:
                return
            got += chunk
        tails.append(got[got.index(b"\r\n.\r\n") + 2 :])
        writer.write(b"250 2.0.0 queued\r\n")
        await writer.drain()
        pending = got[got.index(b"\r\n.\r\n") + 5 :].split(b"\r\n")[:-1]
        while True:
            cmd = pending.pop(0) if pending else await read_line(reader)
            commands.append(cmd.upper())
            if cmd.upper() == b"QUIT":
                if quit_read is not None:
                    quit_read.set()
                writer.write(b"221 bye\r\n")
                await writer.drain()
                return
            writer.write(b"250 ok\r\n")
            await writer.drain()

    return handler


async def test_quit_follows_the_end_of_data_in_the_same_write() -> None:
    """A session that will not be cached sends QUIT behind "." in one write."""
    tails: list[bytes] = []
    commands: list[bytes] = []
    quit_read = asyncio.Event()
    async with scripted(_recording_tail(tails, commands, quit_read)) as srv:
        result = await deliver_once(srv.nexthop, FAST, RCPTS[:1])
        await asyncio.wait_for(quit_read.wait(), TIMEOUT)
    assert result.recipients[0].outcome is Outcome.SENT
    assert tails == [b".\r\nQUIT\r\n"]
    assert commands == [b"QUIT"]


async def test_a_session_kept_for_the_cache_sends_no_quit_behind_the_data() -> None:
    """With the connection cache the session stays open after "."; QUIT comes at close."""
    tails: list[bytes] = []
    commands: list[bytes] = []
    quit_read = asyncio.Event()
    async with scripted(_recording_tail(tails, commands, quit_read)) as srv:
        settings = dataclasses.replace(FAST, connection_cache_destinations=(srv.nexthop,))
        agent = SmtpAgent(settings)
        try:
            result = await agent.deliver(make_request(srv.nexthop, list(RCPTS[:1])))
            assert len(agent.cache) == 1
        finally:
            await agent.close()
        await asyncio.wait_for(quit_read.wait(), TIMEOUT)  # QUIT's reply is not awaited
    assert result.recipients[0].outcome is Outcome.SENT
    assert tails == [b".\r\n"]
    assert commands == [b"QUIT"]  # sent by close(), not behind the data


async def test_an_unanswered_pipelined_quit_ends_at_smtp_quit_timeout() -> None:
    """Waiting for QUIT replies (``smtp_skip_quit_response = no``), a server that never
    answers costs ``smtp_quit_timeout``; the message is sent."""

    def answer(n: int) -> bytes:
        return b"354 go\r\n" if n == 2 else b"250 ok\r\n"

    async def then(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).rstrip(b"\r\n") != b".":
            pass
        writer.write(b"250 2.0.0 queued\r\n")
        await writer.drain()
        await wait_forever()  # QUIT arrives and is never answered

    # The default (300 s) would outlast deliver_once's 30 s bound and fail the test.
    settings = dataclasses.replace(FAST, quit_timeout=0.3, skip_quit_response=False)
    async with scripted(_pipelined(answer, then=then)) as srv:
        result = await deliver_once(srv.nexthop, settings, RCPTS[:1])
    assert (result.recipients[0].outcome, result.hop) == (Outcome.SENT, None)


async def test_a_server_that_stops_reading_the_body_ends_at_smtp_data_xfer_timeout() -> None:
    """Content the server never reads fills the socket; ``smtp_data_xfer_timeout`` ends it."""

    def answer(n: int) -> bytes:
        return b"354 go\r\n" if n == 2 else b"250 ok\r\n"

    async def then(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await wait_forever()  # never reads the body

    body = b"Subject: big\r\n\r\n" + (b"x" * 76 + b"\r\n") * 400_000  # 31 MB, past any buffer
    settings = dataclasses.replace(FAST, data_xfer_timeout=0.3, data_done_timeout=SLOW)
    async with scripted(_pipelined(answer, then=then)) as srv:
        agent = SmtpAgent(settings)
        try:
            request = make_request(srv.nexthop, list(RCPTS[:1]), content=body)
            result = await asyncio.wait_for(agent.deliver(request), 30)
        finally:
            await agent.close()
    (r,) = result.recipients
    assert (r.outcome, r.dsn) == (Outcome.DEFERRED, "4.4.2")
    assert r.reply == f"conversation with {_relay(srv)} timed out while sending message body"
    assert result.hop is not None
