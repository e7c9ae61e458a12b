"""``Channel.read``'s own timer: a silent client times out, a timely one does not."""

from __future__ import annotations

import asyncio

import pytest

from qmgrd.listener.channel import Channel


async def test_read_times_out_when_nothing_arrives() -> None:
    """A read that waits longer than its timeout raises TimeoutError."""
    chan = Channel(1024)
    with pytest.raises(TimeoutError):
        await chan.read(100, 0.01)


async def test_data_before_the_timeout_is_returned_and_the_timer_cancelled() -> None:
    """Data that arrives in time is returned; the disarmed timer fails no later read."""
    chan = Channel(1024)
    loop = asyncio.get_running_loop()
    loop.call_soon(chan.data_received, b"EHLO x\r\n")
    assert await chan.read(100, 5.0) == b"EHLO x\r\n"
    chan.data_received(b"QUIT\r\n")  # buffered: returned at once, no timer armed
    assert await chan.read(100, 0.0) == b"QUIT\r\n"
    chan.eof_received()
    assert await chan.read(100, 5.0) == b""


async def test_read_without_timeout_waits_for_data() -> None:
    """``timeout=None`` waits as long as it takes (the caller bounds it otherwise)."""
    chan = Channel(1024)
    asyncio.get_running_loop().call_soon(chan.data_received, b"x")
    assert await asyncio.wait_for(chan.read(10), 5.0) == b"x"


async def test_whole_chunks_are_handed_out_as_received() -> None:
    """A read that takes a whole chunk returns that object (no copy); a larger one is split."""
    chan = Channel(1 << 20)
    big = b"x" * 100_000
    chan.data_received(big)
    assert await chan.read(1 << 20, 1.0) is big
    chan.data_received(b"ab")
    chan.data_received(b"cd")
    chan.data_received(b"efgh")
    assert await chan.read(5, 1.0) == b"abcd"  # small chunks that fit are joined
    assert await chan.read(2, 1.0) == b"ef"  # split: the rest stays first
    assert await chan.read(100, 1.0) == b"gh"
    chan.eof_received()
    assert await chan.read(100, 1.0) == b""
