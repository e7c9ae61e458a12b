"""The regulated pool's threads: grow while blocked, park when overcommitted (workpool)."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from qmgrd.daemon.workpool import WorkPool
from tests.support.clock import FakeClock
from tests.support.waits import wait_until


async def test_results_and_exceptions_come_back() -> None:
    """A job's return value or exception reaches the awaiting coroutine."""
    pool = WorkPool(target=2, limit=4)
    try:
        assert await pool.run(lambda: 41 + 1) == 42

        def boom() -> None:
            raise OSError("disk")

        with pytest.raises(OSError, match="disk"):
            await pool.run(boom)
        results = await asyncio.gather(
            *(pool.run(functools.partial(int.__mul__, i, 2)) for i in range(50))
        )
        assert results == [i * 2 for i in range(50)]
        assert pool.counts().spawned <= 2  # never short for 0.1 s: the base size only
    finally:
        pool.close()
    assert pool.counts().waiting == 0  # every thread ended
    assert await pool.run(lambda: "again") == "again"  # a closed pool starts anew
    pool.close()


async def test_blocked_workers_grow_the_pool_only_after_the_quiet_period() -> None:
    """With the only worker blocked, a queued job runs on a new thread once 0.1 s have passed."""
    clock = FakeClock()
    pool = WorkPool(target=1, limit=2, clock=clock)
    release = threading.Event()
    try:
        stuck = asyncio.ensure_future(pool.run(lambda: release.wait(20)))
        await wait_until(lambda: pool.counts().blocked == 1, "the first job to block")
        second = asyncio.ensure_future(pool.run(lambda: "ran"))
        await asyncio.sleep(0)
        clock.advance(0.05)
        pool.regulate()
        counts = pool.counts()
        assert (counts.queued, counts.spawned) == (1, 1)  # still inside the quiet period
        clock.advance(0.06)
        pool.regulate()
        assert await asyncio.wait_for(second, 20) == "ran"
        assert pool.counts().spawned == 2 and not stuck.done()
        release.set()
        assert await asyncio.wait_for(stuck, 20) is True
        # Two workers for a target of 1: the pool overcommitted, so one of them parked.
        await wait_until(lambda: pool.counts().parked == 1, "a worker to park")
        counts = pool.counts()
        assert counts.waiting == 1 and counts.running == 0
    finally:
        release.set()
        pool.close()


async def test_a_parked_spare_is_reused_before_a_new_thread() -> None:
    """After parking, the next shortfall wakes the spare instead of starting a third thread."""
    clock = FakeClock()
    pool = WorkPool(target=1, limit=3, clock=clock)
    gates = [threading.Event(), threading.Event()]
    try:
        first = asyncio.ensure_future(pool.run(lambda: gates[0].wait(20)))
        await wait_until(lambda: pool.counts().blocked == 1, "the first job to block")
        quick = asyncio.ensure_future(pool.run(lambda: None))
        await asyncio.sleep(0)
        clock.advance(0.2)
        pool.regulate()
        await asyncio.wait_for(quick, 20)
        gates[0].set()
        await asyncio.wait_for(first, 20)
        await wait_until(lambda: pool.counts().parked == 1, "a worker to park")
        second = asyncio.ensure_future(pool.run(lambda: gates[1].wait(20)))
        await wait_until(lambda: pool.counts().blocked == 1, "the next job to block")
        again = asyncio.ensure_future(pool.run(lambda: "spare"))
        await asyncio.sleep(0)
        clock.advance(0.2)
        pool.regulate()
        assert await asyncio.wait_for(again, 20) == "spare"
        counts = pool.counts()
        assert (counts.spawned, counts.unparked) == (2, 1)
        gates[1].set()
        await asyncio.wait_for(second, 20)
    finally:
        for gate in gates:
            gate.set()
        pool.close()


async def test_blocking_section_marks_a_non_blocking_job() -> None:
    """``with pool.blocking()`` inside a CPU job counts the worker as blocked meanwhile."""
    pool = WorkPool(target=1, limit=1)
    seen: list[int] = []

    def job() -> None:
        with pool.blocking():
            seen.append(pool.counts().blocked)
        seen.append(pool.counts().blocked)

    try:
        await pool.run(job, blocking=False)
        assert seen == [1, 0]
    finally:
        pool.close()


async def test_a_shortfall_wakes_the_loop_once_to_arm_its_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While a deadline waits to be armed, more regulations post no more wake-ups: one
    ``_arm`` reaches the loop, and once it ran the deadline timer is armed."""
    clock = FakeClock()
    pool = WorkPool(target=1, limit=2, clock=clock)
    release = threading.Event()
    loop = asyncio.get_running_loop()
    posted: list[object] = []
    real = loop.call_soon_threadsafe

    def counted(callback: Any, *args: Any, **kwargs: Any) -> asyncio.Handle:
        if getattr(callback, "__name__", "") == "_arm":
            posted.append(callback)
        return real(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", counted)
    try:
        stuck = asyncio.ensure_future(pool.run(lambda: release.wait(20)))
        await wait_until(lambda: pool.counts().blocked == 1, "the first job to block")
        queued = [asyncio.ensure_future(pool.run(lambda: "ran")) for _ in range(3)]
        await asyncio.sleep(0)  # the three are submitted (each regulates); _arm has not run
        for _ in range(5):
            pool._regulate()  # each worker event regulates; the shortfall has a deadline
        assert len(posted) == 1
        await asyncio.sleep(0)  # the loop runs _arm: the timer is armed
        assert pool._timer is not None and not pool._arming
        clock.advance(0.2)
        pool.regulate()  # the deadline passed: a second worker takes the queued jobs
        assert await asyncio.wait_for(asyncio.gather(*queued), 20) == ["ran"] * 3
        release.set()
        assert await asyncio.wait_for(stuck, 20) is True
    finally:
        release.set()
        pool.close()
