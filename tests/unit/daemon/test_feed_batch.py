"""Bounded work per engine pass: a scan that finds many files starts at most FEED_BATCH loads
per pass, and the remaining ones in the passes that follow (nothing is left waiting)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from qmgrd.daemon.loading import FEED_BATCH
from qmgrd.daemon.table import Tracked
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


async def test_loads_start_in_batches_of_feed_batch_per_pass(tmp_path: Path) -> None:
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    count = 2 * FEED_BATCH + 10
    for i in range(count):
        submit(spool, clock, "s@src.test", [f"r{i}@dst.test"])
    per_pass: Counter[int] = Counter()
    load = engine.loader.load

    def counted(record: Tracked, now: float) -> None:
        per_pass[engine._passes] += 1  # the pass that started this load
        load(record, now)

    engine.loader.load = counted  # type: ignore[method-assign]
    task = await run_until_idle(engine)
    try:
        assert sum(per_pass.values()) == count
        assert max(per_pass.values()) == FEED_BATCH
        assert len(per_pass) >= 3
        assert len(agent.delivered) == count
    finally:
        await stop_engine(engine, task)
