"""The last delivery's file job removes a finished message (``qmgrd.daemon.outcomes``)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from qmgrd.daemon import outcomes
from qmgrd.daemon.table import MessageState
from qmgrd.delivery.agent import Outcome
from qmgrd.ops.operation import Operation, OpResult
from qmgrd.spool import recycle
from qmgrd.spool.recycle import RECYCLE_DIR
from tests.support.agents import FakeAgent, stalled_agent
from tests.support.engine import (
    create_test_engine,
    fail_early_removal,
    run_until_idle,
    stop_engine,
    submit,
)
from tests.support.waits import TIMEOUT


def _spy(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[tuple[Any, ...]]:
    """Record the calls of ``owner.name`` (still calling it)."""
    calls: list[tuple[Any, ...]] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return calls


@pytest.mark.parametrize("removal_fails", [False, True])
async def test_the_last_delivery_removes_the_file_without_marks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removal_fails: bool
) -> None:
    """A message sent to its only recipient: no done mark, no finish job; same log lines.
    When the job's removal fails it marks the recipient done and the finish removes the file,
    with no error logged."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    if removal_fails:
        fail_early_removal(monkeypatch)
    marks = _spy(monkeypatch, outcomes, "mark_done")
    completes = _spy(monkeypatch, engine.finisher, "_complete")
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    with capture_logs() as logs:
        task = await run_until_idle(engine)
        await stop_engine(engine, task)
    assert agent.delivered == [(qid, "r@a.test")]
    assert (len(marks), len(completes)) == ((1, 1) if removal_fails else (0, 0))
    assert spool.list_ids("active") == [] and spool.list_ids("deferred") == []
    pooled = list((spool.root / RECYCLE_DIR).iterdir())
    assert len(pooled) == 1  # pooled, as the finish does
    assert [e for e in logs if e.get("log_level") == "error"] == []
    events = [e["event"] for e in logs if e.get("queue_id") == qid]
    assert events[-2:] == ["sent", "removed"] and events.count("removed") == 1
    assert engine.ctx.stats.messages_removed == 1


async def _two_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, together: bool
) -> tuple[int, int]:
    """Deliver a message of two entries (one at a time, or both in flight at once); the
    done-mark jobs and early removals it took."""
    agent = stalled_agent() if together else FakeAgent()
    main = "" if together else "default_process_limit = 1"
    engine, spool, clock = create_test_engine(tmp_path, agent, main)
    marks = _spy(monkeypatch, outcomes, "mark_done")
    retires = _spy(monkeypatch, outcomes, "retire")
    qid = submit(spool, clock, "s@src.test", ["one@a.test", "two@b.test"])
    task = asyncio.create_task(engine.run())
    if together:
        await agent.wait_started(2)
        agent.release()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    assert sorted(agent.delivered) == [(qid, "one@a.test"), (qid, "two@b.test")]
    assert spool.list_ids("active") == []
    return len(marks), len(retires)


async def test_earlier_deliveries_mark_and_the_last_one_removes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries one after the other: the first delivery marks its recipient done."""
    assert await _two_entries(tmp_path, monkeypatch, together=False) == (1, 1)


async def test_deliveries_in_flight_together_all_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two entries in flight at once: neither is sure to be the last; the finisher removes."""
    assert await _two_entries(tmp_path, monkeypatch, together=True) == (2, 0)


async def test_a_deferred_recipient_takes_the_whole_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Something to log in defer/: no early removal; the message goes to deferred/."""
    agent = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.2.0", "450 later"))
    engine, spool, clock = create_test_engine(tmp_path, agent)
    retires = _spy(monkeypatch, outcomes, "retire")
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert retires == []
    assert spool.list_ids("deferred") == [qid]


async def test_an_operation_during_the_removal_waits_for_the_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operator's hold while the removal runs waits (FINISHING), then finds nothing."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    entered, release = threading.Event(), threading.Event()
    real = recycle.retire

    def slow(*args: Any) -> bool:
        entered.set()
        release.wait(TIMEOUT)
        return real(*args)

    monkeypatch.setattr(outcomes, "retire", slow)
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = asyncio.create_task(engine.run())
    try:
        assert await asyncio.to_thread(entered.wait, TIMEOUT)
        record = engine.ctx.table.find(qid)
        assert record is not None and record.state is MessageState.FINISHING
        hold = asyncio.create_task(engine.operate(Operation.HOLD, [qid]))
        await asyncio.sleep(0)
        assert not hold.done()
    finally:
        release.set()
    assert await asyncio.wait_for(hold, TIMEOUT) == {qid: OpResult.NOT_FOUND}
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    assert spool.list_ids("hold") == [] and spool.list_ids("active") == []
