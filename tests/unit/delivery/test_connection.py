"""The client connection adapter over a fake transport: reply queue, flow control, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
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


class _Timer:
    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class _Clock:
    """The loop as the connection sees it, with a clock and timers moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[_Timer] = []

    def time(self) -> float:
        return self.now

    def create_future(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    def call_at(self, when: float, callback: Callable[[], None]) -> _Timer:
        timer = _Timer(when, callback)
        self.timers.append(timer)
        return timer

    def armed(self) -> list[float]:
        return [t.when for t in self.timers if not t.cancelled]

    def fire(self) -> None:
        """Move the clock to the earliest armed timer and run it."""
        timer = min((t for t in self.timers if not t.cancelled), key=lambda t: t.when)
        self.timers.remove(timer)
        self.now = timer.when
        timer.callback()


def _clocked() -> tuple[Connection, _Clock]:
    conn, _ = _connected()
    clock = _Clock()
    conn._loop = clock  # type: ignore[assignment]
    return conn, clock


async def _answered(conn: Connection, timeout: float) -> Reply:
    """A wait of ``timeout`` seconds that a reply ends."""
    task = asyncio.ensure_future(conn.read_reply(timeout))
    await asyncio.sleep(0)  # the wait starts (no timing: one pass of the loop)
    conn.data_received(b"250 ok\r\n")
    return await task


async def test_a_wait_outlasts_the_timer_an_earlier_shorter_wait_armed() -> None:
    """The timer armed by an earlier, shorter wait re-arms for the current wait's deadline."""
    conn, clock = _clocked()
    assert await _answered(conn, 10.0) == Reply(250, "ok")
    waiting = asyncio.ensure_future(conn.read_reply(30.0))
    await asyncio.sleep(0)
    assert clock.armed() == [110.0]  # no timer made for the second wait
    clock.fire()
    assert clock.armed() == [130.0] and not waiting.done()
    clock.fire()
    with pytest.raises(TimeoutError):
        await waiting


async def test_a_shorter_wait_than_the_armed_timer_times_out_at_its_own_deadline() -> None:
    """A wait whose deadline comes before the armed timer's re-arms it earlier."""
    conn, clock = _clocked()
    await _answered(conn, 30.0)
    waiting = asyncio.ensure_future(conn.read_reply(10.0))
    await asyncio.sleep(0)
    assert clock.armed() == [110.0]
    clock.fire()
    with pytest.raises(TimeoutError):
        await waiting


async def test_the_timer_is_dropped_when_it_fires_with_no_wait_and_on_close() -> None:
    """A timer that fires between waits is dropped; the next wait arms one; close cancels it."""
    conn, clock = _clocked()
    await _answered(conn, 10.0)
    clock.fire()
    assert clock.armed() == []
    await _answered(conn, 10.0)
    assert clock.armed() == [120.0]
    conn.close()
    assert clock.armed() == []


async def test_next_reply_hands_out_queued_replies_without_waiting() -> None:
    """next_reply returns the queued replies in order, then None; read_reply waits after."""
    conn, _ = _connected()
    conn.data_received(b"250 a\r\n354 go\r\n")
    assert [conn.next_reply(), conn.next_reply(), conn.next_reply()] == [
        Reply(250, "a"),
        Reply(354, "go"),
        None,
    ]
    conn.data_received(b"250 done\r\n")
    assert await conn.read_reply(1.0) == Reply(250, "done")
