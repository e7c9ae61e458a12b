"""Intake over real SMTP on 127.0.0.1: addresses kept exactly, streaming to disk, bounded memory."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import os
import resource
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.listener import ListenerHandle, ListenerSettings, start_listener
from qmgrd.spool import QueueFile, Spool, read_content

TIMEOUT = 60
SETTINGS = ListenerSettings(
    listen=(("127.0.0.1", 0),),
    myhostname="mx.test",
    mynetworks=(ipaddress.ip_network("127.0.0.1/32"),),
    message_size_limit=10_240_000,
    smtpd_recipient_limit=50_000,
    smtpd_timeout=60,
)


@contextlib.asynccontextmanager
async def listening(tmp_path: Path) -> AsyncIterator[tuple[ListenerHandle, Spool]]:
    spool = Spool(tmp_path / "spool")
    spool.ensure_dirs()
    handle = await start_listener(SETTINGS, spool, on_commit=lambda _: None, clock=lambda: 1e9)
    try:
        yield handle, spool
    finally:
        await asyncio.wait_for(handle.wait_closed(), TIMEOUT)


async def _replies(reader: asyncio.StreamReader, count: int) -> list[str]:
    """``count`` replies (their last lines)."""
    out: list[str] = []
    while len(out) < count:
        line = await asyncio.wait_for(reader.readline(), TIMEOUT)
        if not line:
            break
        if line[3:4] != b"-":
            out.append(line.decode("utf-8", "replace").rstrip("\r\n"))
    return out


async def _dialogue(port: int, lines: list[bytes]) -> list[str]:
    """Send each line (pipelined), return one reply per line plus the greeting."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(line + b"\r\n" for line in lines))
        return await _replies(reader, len(lines) + 1)
    finally:
        writer.close()


def _temporaries(spool: Spool) -> list[str]:
    return [n for n in os.listdir(spool.root / "incoming") if n.startswith(".")]


@pytest.mark.parametrize(
    ("command", "reply"),
    [
        (b'MAIL FROM:<"a\\\x1bb"@src.test>', "501 5.1.7 Bad sender address syntax"),
        (b'MAIL FROM:<"a\\\x00b"@src.test>', "501 5.1.7 Bad sender address syntax"),
        (b'MAIL FROM:<"a\\\xffb"@src.test>', "501 5.1.7 Bad sender address syntax"),
        (b"MAIL FROM:<a\xff@src.test>", "501 5.1.7 Bad sender address syntax"),
        (b"MAIL FROM:<postmaster>", "501 5.1.7 Bad sender address syntax"),
    ],
)
async def test_senders_with_controls_or_bad_bytes_are_refused(
    tmp_path: Path, command: bytes, reply: str
) -> None:
    """Escaped controls and bytes that are not UTF-8 get 501 5.1.7 at MAIL."""
    async with listening(tmp_path) as (handle, _):
        replies = await _dialogue(handle.addresses[0][1], [b"EHLO c.test", command])
    assert replies[2] == reply


@pytest.mark.parametrize(
    "address",
    [b'"a\\\x1bb"@dst.test', b'"a\\\x7fb"@dst.test', b'"\\\xc3\\\xa9"@dst.test', b"r\xc3@dst.test"],
)
async def test_recipients_with_controls_or_bad_bytes_are_refused(
    tmp_path: Path, address: bytes
) -> None:
    """Escaped controls and escaped or broken UTF-8 get 501 5.1.3 at RCPT."""
    async with listening(tmp_path) as (handle, _):
        replies = await _dialogue(
            handle.addresses[0][1],
            [b"EHLO c.test", b"MAIL FROM:<s@src.test> SMTPUTF8", b"RCPT TO:<" + address + b">"],
        )
    assert replies[3] == "501 5.1.3 Bad recipient address syntax"


async def test_what_rfc_5321_allows_is_stored_exactly_as_sent(tmp_path: Path) -> None:
    """<postmaster> (any case), "sp ace"@d and escaped quotes are accepted and stored unchanged."""
    rcpts = [b"<PostMaster>", b'<"sp ace"@dst.test>', b'<"q\\"uote"@dst.test>', b"<postmaster>"]
    async with listening(tmp_path) as (handle, spool):
        lines = [b"EHLO c.test", b'MAIL FROM:<"s p"@src.test>']
        lines += [b"RCPT TO:" + r for r in rcpts]
        lines += [b"DATA", b"hi\r\n."]
        replies = await _dialogue(handle.addresses[0][1], lines)
        (qid,) = spool.list_ids("incoming")
        qf = QueueFile.open(spool.path("incoming", qid))
    assert all(r.startswith(("2", "3")) for r in replies), replies
    assert qf.sender == '"s p"@src.test'
    assert [r.address for r in qf.read_all_recipients()] == [
        "PostMaster",
        '"sp ace"@dst.test',
        '"q\\"uote"@dst.test',
        "postmaster",
    ]


async def test_many_pipelined_recipients_are_written_as_they_arrive(tmp_path: Path) -> None:
    """20,000 pipelined RCPTs: the temporary file grows before DATA; all are stored, in order."""
    async with listening(tmp_path) as (handle, spool):
        reader, writer = await asyncio.open_connection("127.0.0.1", handle.addresses[0][1])
        rcpts = [f"user{i}@d{i % 7}.test" for i in range(20_000)]
        writer.write(b"EHLO c.test\r\nMAIL FROM:<s@src.test>\r\n")
        writer.write(b"".join(f"RCPT TO:<{r}>\r\n".encode() for r in rcpts))
        replies = await _replies(reader, 3 + len(rcpts))
        assert all(r.startswith("250") for r in replies[1:]), set(replies)
        (temp,) = _temporaries(spool)  # recipients are on disk already
        assert (spool.root / "incoming" / temp).stat().st_size > 200_000
        writer.write(b"DATA\r\nhello\r\n.\r\nQUIT\r\n")
        end = await _replies(reader, 3)
        writer.close()
        (qid,) = spool.list_ids("incoming")
        qf = QueueFile.open(spool.path("incoming", qid))
        assert [r.address for r in qf.read_all_recipients()] == rcpts
    assert end[1] == f"250 2.0.0 Ok: queued as {qid}"
    assert read_content(qf.path) == b"hello\r\n"


async def test_rset_and_abort_after_streaming_leave_no_file(tmp_path: Path) -> None:
    """A transaction flushed to disk, then RSET (or a dropped connection), leaves nothing."""
    async with listening(tmp_path) as (handle, spool):
        port = handle.addresses[0][1]
        lines = [b"EHLO c.test", b"MAIL FROM:<s@src.test>"]
        lines += [f"RCPT TO:<u{i}@dst.test>".encode() for i in range(10_000)]
        replies = await _dialogue(port, [*lines, b"RSET", b"QUIT"])
        assert replies[-2:] == ["250 2.0.0 Ok", "221 2.0.0 Bye"]
        assert _temporaries(spool) == [] and spool.list_ids("incoming") == []
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(line + b"\r\n" for line in lines[:3]) + b"DATA\r\n")
        await _replies(reader, 5)
        writer.write(b"x" * 1_000_000)
        await writer.drain()
        for _ in range(500):  # the content reaches the disk while the client is still there
            if _temporaries(spool):
                break
            await asyncio.sleep(0.01)
        assert _temporaries(spool)
        writer.transport.abort()
        for _ in range(500):
            if not handle.sessions:
                break
            await asyncio.sleep(0.01)
        assert _temporaries(spool) == [] and spool.list_ids("incoming") == []


@pytest.mark.slow
async def test_150_slow_10mb_data_sessions_keep_memory_bounded(tmp_path: Path) -> None:
    """150 concurrent 10 MB DATA transfers grow the process's peak RSS by far less than 1.5 GB."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    piece = (b"x" * 78 + b"\r\n") * 819  # 65,520 bytes
    async with listening(tmp_path) as (handle, spool):
        port = handle.addresses[0][1]

        async def session() -> str:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                writer.write(b"EHLO c\r\nMAIL FROM:<s@src.test>\r\nRCPT TO:<r@d.test>\r\nDATA\r\n")
                await _replies(reader, 5)
                for _ in range(10_000_000 // len(piece)):
                    writer.write(piece)
                    await asyncio.wait_for(writer.drain(), TIMEOUT)
                writer.write(b".\r\nQUIT\r\n")
                return (await _replies(reader, 2))[0]
            finally:
                writer.close()

        replies = await asyncio.wait_for(asyncio.gather(*(session() for _ in range(150))), 600)
        assert all(r.startswith("250 2.0.0 Ok: queued as ") for r in replies)
        assert len(spool.list_ids("incoming")) == 150
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    assert grown < 200, f"peak RSS grew by {grown} MiB"


async def test_ehlo_advertises_what_the_listener_implements(tmp_path: Path) -> None:
    """EHLO lists PIPELINING, SIZE, ENHANCEDSTATUSCODES, 8BITMIME, DSN and SMTPUTF8, no more."""
    async with listening(tmp_path) as (handle, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", handle.addresses[0][1])
        try:
            await reader.readline()
            writer.write(b"EHLO c.test\r\n")
            lines = []
            while True:
                line = (await asyncio.wait_for(reader.readline(), TIMEOUT)).decode().rstrip()
                lines.append(line)
                if line[3:4] != "-":
                    break
        finally:
            writer.close()
    assert [line[4:] for line in lines] == [
        "mx.test",
        "PIPELINING",
        "SIZE 10240000",
        "ENHANCEDSTATUSCODES",
        "8BITMIME",
        "DSN",
        "SMTPUTF8",
    ]


async def test_stalled_data_times_out_logged_and_leaves_nothing(tmp_path: Path) -> None:
    """A client silent mid-DATA past smtpd_timeout is cut off, logged, and its file removed."""
    spool = Spool(tmp_path / "spool")
    spool.ensure_dirs()
    settings = dataclasses.replace(SETTINGS, smtpd_timeout=0.5)
    handle = await start_listener(settings, spool, on_commit=lambda _: None)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", handle.addresses[0][1])
        with capture_logs() as logs:
            writer.write(b"EHLO c\r\nMAIL FROM:<s@src.test>\r\nRCPT TO:<r@d.test>\r\nDATA\r\n")
            writer.write(b"x" * 300_000)  # beyond the buffer: a temporary file exists
            replies = await _replies(reader, 10)  # until the server closes
        writer.close()
    finally:
        await asyncio.wait_for(handle.wait_closed(), TIMEOUT)
    assert replies[-1].startswith("354")
    assert any(e["event"] == "timeout" and e["after"] == "DATA" for e in logs)
    assert _temporaries(spool) == [] and spool.list_ids("incoming") == []
