"""The destination gate on a real engine: a destination the backend calls FULL is asked once,
not once per waiting entry, until the retry time (``qmgrd.daemon.destgate``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from qmgrd.destdb import Admission, DestKey, Limits, Verdict
from qmgrd.destdb.local import LocalState
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, stop_engine, submit
from tests.support.waits import wait_until


class FullState(LocalState):
    """A backend that answers FULL (as a cluster at its cap does) until ``full`` is False,
    and counts the questions it was asked."""

    def __init__(self) -> None:
        super().__init__(time.monotonic)
        self.full = True
        self.asked = 0

    async def admit(self, key: DestKey, limits: Limits) -> Admission:
        self.asked += 1
        await asyncio.sleep(0)  # a round trip: the other entries queue up meanwhile
        if self.full:
            return Admission(Verdict.FULL, count=5)
        return await super().admit(key, limits)


async def test_full_destination_is_asked_once_per_retry_not_per_entry(tmp_path: Path) -> None:
    """Five entries (messages) to one destination selected at once, the backend FULL: one
    question, five entries postponed; after the retry time, with room again, each entry asks
    and goes."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(
        tmp_path,
        agent,
        # A rate limit makes the gate active with local; the burst keeps it out of the way.
        "default_destination_rate_limit = 1000/1s,max_burst=1000\n"
        "initial_destination_concurrency = 5\n",
    )
    gate = engine.ctx.gate
    assert gate is not None and gate.active
    state = FullState()
    gate.state = state
    for i in range(5):  # five messages: five entries for d.test
        submit(spool, clock, "s@src.test", [f"r{i}@d.test"])
    task = asyncio.create_task(engine.run())
    try:
        await wait_until(lambda: gate.postponed >= 5, "five entries postponed")
        assert state.asked == 1
        state.full = False
        clock.advance(1.0)
        engine.ctx.kick()
        await asyncio.wait_for(engine.wait_idle(), 20)
        assert len(agent.delivered) == 5
        assert state.asked == 1 + 5
    finally:
        await stop_engine(engine, task)
