"""A message a listener has just committed is loaded without looking for reason logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.listener.flowgate import FlowFacts
from qmgrd.spool import ReasonRecord, Spool
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit
from tests.support.waits import TIMEOUT


def _count_reason_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str]]:
    calls: list[tuple[str, str, str]] = []
    plain_remove, plain_read = Spool.remove_reasons, Spool.read_reasons

    def remove(self: Spool, kind: str, queue_id: str) -> bool:
        calls.append(("remove", kind, queue_id))
        return plain_remove(self, kind, queue_id)  # type: ignore[arg-type]

    def read(self: Spool, kind: str, queue_id: str) -> list[ReasonRecord]:
        calls.append(("read", kind, queue_id))
        return plain_read(self, kind, queue_id)  # type: ignore[arg-type]

    monkeypatch.setattr(Spool, "remove_reasons", remove)
    monkeypatch.setattr(Spool, "read_reasons", read)
    return calls


async def test_a_listener_commit_is_loaded_without_reason_log_lookups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Notified with its flow facts (a listener's commit), the load neither unlinks a defer
    log nor reads a bounce log for it; it is delivered and removed as ever."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    task = await run_until_idle(engine)
    try:
        calls = _count_reason_calls(monkeypatch)
        qid = submit(spool, clock, "s@x.test", ["r@y.test"])
        engine.notify_incoming(qid, FlowFacts("s@x.test", "192.0.2.1"))
        await agent.changes.wait_for(lambda: (qid, "r@y.test") in agent.delivered, "delivery")
        await engine.wait_until(lambda: engine.idle)
        assert [c for c in calls if c[2] == qid] == []
        assert not spool.path("incoming", qid).exists()
        assert not spool.path("active", qid).exists()
    finally:
        await stop_engine(engine, task, TIMEOUT)


async def test_a_file_found_otherwise_still_forgets_its_old_defer_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without flow facts (requeue, pickup, a scan) the load still removes the defer log of
    the last pass before anything else is written for the message."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    task = await run_until_idle(engine)
    try:
        qid = submit(spool, clock, "s@x.test", ["r@y.test"])
        spool.append_reasons(
            "defer", qid, [ReasonRecord("r@y.test", "4.4.1", "delayed", "old", 1.0, "none")]
        )
        calls = _count_reason_calls(monkeypatch)
        engine.notify_incoming(qid)
        await agent.changes.wait_for(lambda: (qid, "r@y.test") in agent.delivered, "delivery")
        await engine.wait_until(lambda: engine.idle)
        assert ("remove", "defer", qid) in calls
        assert ("read", "bounce", qid) in calls
        assert spool.read_reasons("defer", qid) == []
    finally:
        await stop_engine(engine, task, TIMEOUT)
