"""IoBatcher: jobs queued behind a running hop share the next one; a stalled hop gets company."""

from __future__ import annotations

import asyncio
import threading
from functools import partial

import pytest

from qmgrd.daemon.iobatch import IoBatcher
from qmgrd.daemon.workpool import WorkPool

BOUND = 10.0  # seconds: every wait in these tests is bounded


def _blocking(started: threading.Event, release: threading.Event, value: str) -> str:
    started.set()
    if not release.wait(BOUND):
        raise TimeoutError("never released")
    return value


async def _wait_thread_event(event: threading.Event) -> None:
    async with asyncio.timeout(BOUND):
        while not await asyncio.to_thread(event.wait, 0.5):
            pass


@pytest.mark.parametrize("pooled", [False, True])
async def test_jobs_queued_behind_a_hop_share_the_next_hop(pooled: bool) -> None:
    """While one hop runs, later jobs wait and then run together: 4 jobs, 2 hops, in order."""
    pool = WorkPool(target=2) if pooled else None
    io = IoBatcher(pool=pool, stall=60.0)
    started, release = threading.Event(), threading.Event()
    order: list[str] = []
    try:
        first = io.submit(lambda: _blocking(started, release, "a"))
        await _wait_thread_event(started)

        def note(v: str) -> str:
            order.append(v)
            return v

        rest = [io.submit(partial(note, v)) for v in "bcd"]
        await asyncio.sleep(0)
        assert not any(f.done() for f in rest)  # queued behind the running hop
        release.set()
        async with asyncio.timeout(BOUND):
            results = [await first, *[await f for f in rest]]
        assert results == ["a", "b", "c", "d"]
        assert order == ["b", "c", "d"]
        assert (io.hops, io.jobs) == (2, 4)
    finally:
        release.set()
        await io.wait_idle()
        if pool is not None:
            pool.close()


async def test_a_stalled_hop_gets_another_beside_it() -> None:
    """A job queued ``stall`` seconds behind a hop that does not end starts a hop of its own:
    here the first job can only end once the second one ran."""
    io = IoBatcher(stall=0.0)
    started, release = threading.Event(), threading.Event()
    first = io.submit(lambda: _blocking(started, release, "slow"))
    await _wait_thread_event(started)

    def unblock() -> str:
        release.set()
        return "released"

    second = io.submit(unblock)
    async with asyncio.timeout(BOUND):
        assert await second == "released"
        assert await first == "slow"
    assert io.hops == 2
    await io.wait_idle()


async def test_a_job_after_a_drain_ended_starts_at_once() -> None:
    """A job submitted in the turn a drain ends (its task not yet reaped) does not wait for
    the stall timer: with a stall of a minute it still runs at once."""
    io = IoBatcher(stall=60.0)
    async with asyncio.timeout(BOUND):
        assert await io.submit(lambda: 1) == 1
        assert await io.submit(lambda: 2) == 2  # submitted before the first drain is reaped
    assert io.hops == 2
    await io.wait_idle()


async def test_a_failing_job_fails_only_its_own_future() -> None:
    """An exception goes to the job's awaiting coroutine; the other jobs of the hop succeed."""
    io = IoBatcher()
    started, release = threading.Event(), threading.Event()
    first = io.submit(lambda: _blocking(started, release, "ok"))
    await _wait_thread_event(started)

    def broken() -> None:
        raise OSError("disk on fire")

    bad = io.submit(broken)
    good = io.submit(lambda: "fine")
    release.set()
    async with asyncio.timeout(BOUND):
        assert await first == "ok"
        with pytest.raises(OSError, match="disk on fire"):
            await bad
        assert await good == "fine"
    await io.wait_idle()


async def test_a_failed_hop_fails_its_jobs() -> None:
    """A hop the pool refuses (closing) fails every job of the hop instead of leaving it
    waiting for ever."""
    pool = WorkPool(target=1)
    io = IoBatcher(pool=pool)

    async def refused(fn: object, *, blocking: bool = True) -> object:
        raise RuntimeError("pool closed")

    pool.run = refused  # type: ignore[method-assign, assignment]
    futures = [io.submit(lambda: 1), io.submit(lambda: 2)]
    async with asyncio.timeout(BOUND):
        for future in futures:
            with pytest.raises(RuntimeError, match="pool closed"):
                await future
    await io.wait_idle()
    pool.close()


async def test_a_drain_cancelled_before_it_ran_does_not_block_later_jobs() -> None:
    """A drain task cancelled before its first step (loop teardown, a test's cancel) is not
    counted as running: the next job starts a drain at once, which runs the waiting job too."""
    io = IoBatcher(workers=1, stall=60.0)
    first = io.submit(lambda: 1)
    drains = list(io._running)
    for task in drains:
        task.cancel()
    await asyncio.gather(*drains, return_exceptions=True)  # ended without running a step
    async with asyncio.timeout(BOUND):
        assert await io.submit(lambda: 2) == 2
        assert await first == 1
    await io.wait_idle()
