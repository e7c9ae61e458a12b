"""The client connection adapter over a fake transport: reply queue, flow control, errors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from qmgrd.delivery.client import Reply, ReplyError
from qmgrd.delivery.connection import QUEUE_LIMIT, Connection


class _Transport:
    """Records what the adapter asks of its transport."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.lines: list[list[bytes]] = []  # writelines calls, their buffers unjoined
        self.paused = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def writelines(self, parts: Iterable[bytes]) -> None:
        self.lines.append(list(parts))

    def is_closing(self) -> bool:
        return self.aborted

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


def _connected() -> tuple[Connection, _Transport]:
    conn = Connection()
    transport = _Transport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def test_pipelined_replies_from_one_read_are_handed_out_in_order() -> None:
    """Several replies in one read are queued and read back in order without waiting."""
    conn, _ = _connected()
    conn.data_received(b"250 a\r\n250-b\r\n250 c\r\n354 go\r\n")
    assert [await conn.read_reply(1.0) for _ in range(3)] == [
        Reply(250, "a"),
        Reply(250, "b\nc"),
        Reply(354, "go"),
    ]


async def test_a_flood_of_replies_pauses_reading_until_they_are_taken() -> None:
    """More than QUEUE_LIMIT unread replies pause the transport; taking them resumes it."""
    conn, transport = _connected()
    conn.data_received(b"250 ok\r\n" * (QUEUE_LIMIT + 1))
    assert transport.paused
    for _ in range(QUEUE_LIMIT // 2 + 1):
        await conn.read_reply(1.0)
    assert not transport.paused


async def test_replies_before_a_broken_one_are_still_read_then_the_error() -> None:
    """A malformed reply aborts the connection; earlier replies come first, then ReplyError."""
    conn, transport = _connected()
    conn.data_received(b"250 ok\r\nnot smtp\r\n")
    assert transport.aborted
    assert await conn.read_reply(1.0) == Reply(250, "ok")
    with pytest.raises(ReplyError):
        await conn.read_reply(1.0)
    assert not conn.is_connected


async def test_end_of_stream_after_replies() -> None:
    """Replies that arrived before the server closed are read; then ConnectionError."""
    conn, _ = _connected()
    conn.data_received(b"221 bye\r\n")
    assert conn.eof_received() is False  # let the transport close
    conn.connection_lost(None)
    assert await conn.read_reply(1.0) == Reply(221, "bye")
    with pytest.raises(ConnectionError):
        await conn.read_reply(1.0)
    with pytest.raises(ConnectionError):
        conn.write(b"QUIT\r\n")


async def test_command_writes_its_line_and_returns_the_reply() -> None:
    """``command`` writes the line as given and returns the next reply."""
    conn, transport = _connected()
    conn.data_received(b"250 2.0.0 reset\r\n")
    assert await conn.command(b"RSET\r\n", 1.0) == Reply(250, "2.0.0 reset")
    assert transport.written == [b"RSET\r\n"]


async def test_writelines_hands_the_buffers_over_unjoined_then_fails_once_closed() -> None:
    """``writelines`` passes its buffers to the transport in one call, as they are (no
    joined copy); once the connection is lost it raises ConnectionError like ``write``."""
    conn, transport = _connected()
    body = b"x" * 100_000
    conn.writelines((body, b".\r\n"))
    assert transport.lines == [[body, b".\r\n"]] and transport.lines[0][0] is body
    conn.connection_lost(None)
    with pytest.raises(ConnectionError):
        conn.writelines((b".\r\n",))
    assert len(transport.lines) == 1
