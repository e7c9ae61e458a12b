"""``Channel.read``'s timer (its own or a shared ``Deadlines``): a silent client times out,
a timely one does not."""

from __future__ import annotations

import asyncio
import gc
import math
import weakref

import pytest

from qmgrd.daemon.process import loop_factory
from qmgrd.listener.channel import _TICK as TICK
from qmgrd.listener.channel import Channel, Deadlines


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


async def test_a_later_read_outlives_an_earlier_reads_deadline() -> None:
    """The one timer, armed for an earlier read, does not cut a later read short.

    The first read's deadline passes while the second waits (its data comes
    later, on the loop's own timer): the second read gets the data; the third,
    with silence, times out no sooner than its own timeout after it began.
    """
    await _later_read_outlives_earlier_deadline()


def test_the_same_on_the_daemons_loop() -> None:
    """The same on uvloop, the daemons' loop (its timers and clock have 1 ms steps)."""
    factory = loop_factory()
    if factory is None:  # pragma: no cover - uvloop is a dependency on Linux
        pytest.skip("no uvloop")
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_later_read_outlives_earlier_deadline())


async def _later_read_outlives_earlier_deadline() -> None:
    chan = Channel(1024)
    loop = asyncio.get_running_loop()
    timeout = 0.2
    first = loop.time()
    loop.call_at(first + 0.1, chan.data_received, b"EHLO x\r\n")
    assert await chan.read(100, timeout) == b"EHLO x\r\n"  # leaves its timer armed
    second = loop.time()
    assert second >= first + 0.1 - TICK
    loop.call_at(second + 0.15, chan.data_received, b"MAIL\r\n")  # after first + timeout
    assert await chan.read(100, timeout) == b"MAIL\r\n"
    assert loop.time() >= first + timeout
    began = loop.time()
    with pytest.raises(TimeoutError):
        await chan.read(100, timeout)
    assert loop.time() >= began + timeout - TICK  # not at an earlier read's deadline


async def test_a_shorter_timeout_than_the_armed_timer_is_kept() -> None:
    """A read with a shorter timeout than the timer already armed times out at its own."""
    chan = Channel(1024)
    loop = asyncio.get_running_loop()
    loop.call_soon(chan.data_received, b"x")
    assert await chan.read(100, 300.0) == b"x"  # the timer now waits 300 s
    began = loop.time()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(chan.read(100, 0.05), 5.0)  # wait_for: fails the test, not hangs
    assert began + 0.05 - TICK <= loop.time() < began + 5.0


async def test_a_lost_connection_releases_the_channel() -> None:
    """After the connection is lost nothing (no pending timer) keeps the channel alive."""
    chan = Channel(1024)
    loop = asyncio.get_running_loop()
    loop.call_soon(chan.data_received, b"x")
    assert await chan.read(100, 300.0) == b"x"  # the timer stays armed for 300 s
    chan.connection_lost(None)
    assert await chan.read(100, 300.0) == b""
    ref = weakref.ref(chan)
    del chan
    gc.collect()
    assert ref() is None


async def test_channels_sharing_deadlines_time_out_each_at_its_own() -> None:
    """Two channels on one ``Deadlines``: the silent one times out, the other reads on."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    quiet, busy = Channel(1024, deadlines=deadlines), Channel(1024, deadlines=deadlines)
    loop.call_later(0.1, busy.data_received, b"EHLO x\r\n")
    began = loop.time()
    results = await asyncio.gather(
        quiet.read(100, 0.05), busy.read(100, 0.3), return_exceptions=True
    )
    assert isinstance(results[0], TimeoutError) and results[1] == b"EHLO x\r\n"
    assert loop.time() >= began + 0.1 - TICK
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(busy.read(100, 0.05), 5.0)


async def test_deadlines_timer_goes_with_the_last_channel() -> None:
    """When every channel on a ``Deadlines`` is lost, its timer is cancelled."""
    loop = asyncio.get_running_loop()
    deadlines = Deadlines(loop)
    chans = [Channel(1024, deadlines=deadlines) for _ in range(2)]
    for chan in chans:
        loop.call_soon(chan.data_received, b"x")
        assert await chan.read(100, 300.0) == b"x"  # watched, the timer armed for 300 s
    assert deadlines.armed_at < math.inf
    chans[0].connection_lost(None)
    assert deadlines.armed_at < math.inf  # the other one is still watched
    chans[1].connection_lost(None)
    assert deadlines.armed_at == math.inf
