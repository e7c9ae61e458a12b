"""The SMTP listener over real SMTP on 127.0.0.1 (smtplib, aiosmtplib and raw sockets)."""

from __future__ import annotations

import asyncio
import ipaddress
import smtplib
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiosmtplib
import pytest
from structlog.testing import capture_logs

from qmgrd.listener import ListenerSettings
from qmgrd.spool import RecipientSpec, read_content
from tests.support.listener import Listening, loopback_settings, start_listening

TIMEOUT = 20


SETTINGS = loopback_settings()


async def _start(tmp_path: Path, settings: ListenerSettings) -> Listening:
    # A fixed clock for the queue files' arrival time; fsync on, as the daemon runs.
    return await start_listening(tmp_path, settings, clock=lambda: 1e9, fsync=True)


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Listening]:
    """The listener with ``SETTINGS`` (recipient limit 3, 100 kB messages)."""
    srv = await _start(tmp_path, SETTINGS)
    yield srv
    await srv.close()


async def _dialogue(port: int, lines: list[bytes], source: str = "127.0.0.1") -> list[str]:
    """Send raw bytes (pipelined) and collect every reply line until the server closes."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0)), TIMEOUT
    )
    writer.write(b"".join(lines))
    replies = []
    try:
        while True:
            line = await asyncio.wait_for(reader.readline(), TIMEOUT)
            if not line:
                break
            replies.append(line.decode().rstrip("\r\n"))
            if replies[-1].startswith("221"):
                break
    finally:
        writer.close()
    return replies


async def test_smtplib_message_lands_with_exact_envelope_and_bytes(server: Listening) -> None:
    """A message with DSN, SMTPUTF8 and 8BITMIME options is stored exactly as sent."""
    body = (
        b"Subject: t\r\n\r\n" + b"x" * 5000 + b"\r\nnul\x00 lone\rcr lone\nlf\r\n.dot\r\n..two\r\n"
    )

    def send() -> dict[str, tuple[int, bytes]]:
        with smtplib.SMTP("127.0.0.1", server.port, timeout=TIMEOUT) as client:
            client.ehlo("client.test")
            assert client.has_extn("dsn") and client.has_extn("smtputf8")
            client.mail(
                "s\u00e9nder@example.com", ["SMTPUTF8", "BODY=8BITMIME", "RET=HDRS", "ENVID=Ab+2Bc"]
            )
            client.rcpt("a@example.com", ["NOTIFY=SUCCESS,DELAY", "ORCPT=rfc822;A@Example.com"])
            client.rcpt("b@\u00fcber.example", ["NOTIFY=NEVER"])
            code, reply = client.data(body)
            return {"data": (code, reply)}

    result = await asyncio.to_thread(send)
    code, reply = result["data"]
    assert code == 250
    qf = server.only_file()
    assert reply.decode() == f"2.0.0 Ok: queued as {qf.queue_id}"
    assert server.commits == [qf.queue_id]
    assert qf.sender == "s\u00e9nder@example.com"
    assert (qf.smtputf8, qf.body, qf.ret, qf.envid) == (True, "8BITMIME", "HDRS", "Ab+2Bc")
    assert (qf.client_addr, qf.helo, qf.arrival_time) == ("127.0.0.1", "client.test", 1e9)
    assert [RecipientSpec(r.address, r.orcpt, r.notify) for r in qf.read_all_recipients()] == [
        RecipientSpec("a@example.com", "rfc822;A@Example.com", frozenset({"SUCCESS", "DELAY"})),
        RecipientSpec("b@\u00fcber.example", None, frozenset({"NEVER"})),
    ]
    assert read_content(qf.path) == body


async def test_aiosmtplib_null_sender_and_log_line(server: Listening) -> None:
    """The null sender is accepted and one log line names id, client, sender, size and nrcpt."""
    message = b"Subject: bounce\r\n\r\nhello\r\n"
    with capture_logs() as logs:
        client = aiosmtplib.SMTP(hostname="127.0.0.1", port=server.port, timeout=TIMEOUT)
        async with client:
            errors, reply = await client.sendmail("", ["r@example.com"], message)
    assert errors == {}
    qf = server.only_file()
    assert qf.sender == ""
    assert read_content(qf.path) == message
    queued = [e for e in logs if e.get("queue_id") == qf.queue_id]
    assert len(queued) == 1
    assert queued[0]["client"] == "unknown[127.0.0.1]"
    assert (queued[0]["from_"], queued[0]["size"], queued[0]["nrcpt"]) == ("<>", len(message), 1)
    assert qf.queue_id in reply


async def test_client_outside_mynetworks_may_not_relay(server: Listening) -> None:
    """A client at 127.0.0.2 gets 554 5.7.1 Relay access denied; nothing is queued."""

    def send() -> tuple[int, bytes]:
        with smtplib.SMTP(
            "127.0.0.1", server.port, timeout=TIMEOUT, source_address=("127.0.0.2", 0)
        ) as client:
            client.ehlo("outsider")
            client.mail("s@example.com")
            return client.rcpt("victim@example.org")

    code, reply = await asyncio.to_thread(send)
    assert code == 554
    assert reply.startswith(b"5.7.1 <victim@example.org>: Relay access denied")
    assert server.spool.list_ids("incoming") == []


async def test_pipelined_transactions_empty_message_and_dot_lines(server: Listening) -> None:
    """Pipelined commands after the end of data are honoured; dots and empty bodies are exact."""
    replies = await _dialogue(
        server.port,
        [
            b"EHLO c\r\nMAIL FROM:<s@x.example>\r\nRCPT TO:<r@x.example>\r\nDATA\r\n",
            b".\r\n",
            b"MAIL FROM:<s@x.example>\r\nRCPT TO:<r@x.example>\r\nDATA\r\n",
            b"..\r\n...a\r\n.\r\nRSET\r\nQUIT\r\n",
        ],
    )
    codes = [r[:3] for r in replies if not r.startswith("250-")]
    assert codes == [
        "220",
        "250",
        "250",
        "250",
        "354",
        "250",
        "250",
        "250",
        "354",
        "250",
        "250",
        "221",
    ]
    contents = sorted(
        read_content(server.spool.path("incoming", i)) for i in server.spool.list_ids("incoming")
    )
    assert contents == [b"", b".\r\n..a\r\n"]


@pytest.mark.parametrize(
    ("commands", "expected"),
    [
        ([b"MAIL FROM:<s@x.example> SIZE=100001\r\n"], "552 5.3.4"),
        ([b"MAIL FROM:<s@x.example>\r\n", b"RCPT TO:<not an address>\r\n"], "501 5.1.3"),
        ([b"MAIL FROM:<s@x.example>\r\n", b"RCPT TO:<user@>\r\n"], "501 5.1.3"),
        ([b"MAIL FROM:<s@x.example>\r\n", b"RCPT TO:<>\r\n"], "501 5.1.3"),
        ([b"MAIL FROM:<@>\r\n"], "501 5.1.7"),
        ([b"MAIL FROM:<s@x.example> FOO=BAR\r\n"], "555 5.5.4"),
        (
            [b"MAIL FROM:<s@x.example>\r\n", b"RCPT TO:<r@x.example> NOTIFY=NEVER,DELAY\r\n"],
            "501 5.5.4",
        ),
        ([b"MAIL FROM:<s\xc3\xa9@x.example>\r\n"], "553 5.6.7"),
        ([b"RCPT TO:<r@x.example>\r\n"], "503 5.5.1"),
    ],
)
async def test_rejections(server: Listening, commands: list[bytes], expected: str) -> None:
    """Each malformed or unacceptable command gets its own code, and the session goes on."""
    replies = await _dialogue(server.port, [b"EHLO c\r\n", *commands, b"NOOP\r\nQUIT\r\n"])
    assert any(r.startswith(expected) for r in replies), replies
    assert replies[-2].startswith("250") and replies[-1].startswith("221")


async def test_too_many_recipients(server: Listening) -> None:
    """The recipient beyond smtpd_recipient_limit gets 452 4.5.3; the others are kept."""
    rcpts = b"".join(b"RCPT TO:<r%d@x.example>\r\n" % i for i in range(4))
    replies = await _dialogue(
        server.port,
        [b"EHLO c\r\nMAIL FROM:<s@x.example>\r\n", rcpts, b"DATA\r\n", b"hi\r\n.\r\nQUIT\r\n"],
    )
    assert [r for r in replies if r.startswith("452")] == ["452 4.5.3 Error: too many recipients"]
    assert [r.address for r in server.only_file().read_all_recipients()] == [
        "r0@x.example",
        "r1@x.example",
        "r2@x.example",
    ]


async def test_oversize_message_is_refused_and_the_session_continues(server: Listening) -> None:
    """Content over message_size_limit gets 552 5.3.4, nothing is queued, next message works."""
    big = b"y" * 999 + b"\r\n"
    replies = await _dialogue(
        server.port,
        [
            b"EHLO c\r\nMAIL FROM:<s@x.example>\r\nRCPT TO:<r@x.example>\r\nDATA\r\n",
            big * 200,
            b".\r\n",
            b"MAIL FROM:<s@x.example>\r\nRCPT TO:<r@x.example>\r\nDATA\r\n",
            b"small\r\n.\r\n",
            b"QUIT\r\n",
        ],
    )
    assert "552 5.3.4 Message size exceeds fixed limit" in replies
    assert read_content(server.only_file().path) == b"small\r\n"


async def test_spool_failure_gives_451_and_the_daemon_keeps_serving(server: Listening) -> None:
    """With incoming/ unusable the client gets 451 4.3.0 and no file; later clients succeed."""
    incoming = server.spool.root / "incoming"
    incoming.rmdir()
    message = [
        b"EHLO c\r\nMAIL FROM:<s@x.example>\r\nRCPT TO:<r@x.example>\r\nDATA\r\n",
        b"hello\r\n.\r\nQUIT\r\n",
    ]
    replies = await _dialogue(server.port, message)
    assert "451 4.3.0 Error: queue file write error" in replies
    incoming.mkdir()
    assert list(incoming.iterdir()) == []
    assert server.commits == []
    replies = await _dialogue(server.port, message)
    assert any(r.startswith("250 2.0.0 Ok: queued as") for r in replies)
    assert len(server.commits) == 1


async def test_many_concurrent_clients(server: Listening) -> None:
    """Twenty concurrent aiosmtplib clients each get their own durable queue file."""

    async def one(i: int) -> None:
        await aiosmtplib.send(
            b"Subject: %d\r\n\r\nbody\r\n" % i,
            sender=f"s{i}@x.example",
            recipients=["r@x.example"],
            hostname="127.0.0.1",
            port=server.port,
            timeout=TIMEOUT,
        )

    await asyncio.gather(*(one(i) for i in range(20)))
    senders = sorted(
        server.spool.open("incoming", q).sender for q in server.spool.list_ids("incoming")
    )
    assert senders == sorted(f"s{i}@x.example" for i in range(20))


async def test_ipv6_listener_and_unlimited_size(tmp_path: Path) -> None:
    """The listener binds ::1 too, and message_size_limit = 0 means no limit."""
    settings = replace(
        SETTINGS,
        listen=(("::1", 0),),
        message_size_limit=0,
        mynetworks=(ipaddress.ip_network("::1/128"),),
    )
    try:
        srv = await _start(tmp_path, settings)
    except Exception:  # pragma: no cover - host without IPv6
        pytest.skip("no IPv6 loopback")
    try:
        await aiosmtplib.send(
            b"z" * 300_000,
            sender="s@x.example",
            recipients=["r@x.example"],
            hostname="::1",
            port=srv.port,
            timeout=TIMEOUT,
        )
        assert srv.only_file().content_size == 300_002  # the client ends it with CRLF
    finally:
        await srv.close()
