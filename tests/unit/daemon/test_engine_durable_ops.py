"""Operator actions on a message being delivered are on disk before they are answered."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_engine
from qmgrd.daemon.engine import Engine
from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, Outcome, RecipientResult
from qmgrd.ops.operation import Operation
from qmgrd.spool import Spool
from tests.support.agents import FakeAgent
from tests.support.clock import FakeClock
from tests.support.engine import create_test_engine as _engine
from tests.support.engine import run_until_idle as _run_until_idle
from tests.support.engine import stop_engine as _stop
from tests.support.engine import submit as _submit

TIMEOUT = 20.0
_ONE_AT_A_TIME = (
    "smtp_destination_recipient_limit = 1\n"
    "smtp_initial_destination_concurrency = 1\n"
    "smtp_destination_concurrency_limit = 1\n"
    "shutdown_timeout = 1s"
)


@dataclass
class NeverAgent:
    """Starts deliveries and never finishes them (a stalled remote)."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    requests: list[DeliveryRequest] = field(default_factory=list)

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Record the request and wait until cancelled by the shutdown."""
        self.requests.append(request)
        self.started.set()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    async def close(self) -> None:
        """Nothing to release."""


async def _restart(tmp_path: Path) -> tuple[FakeAgent, Spool]:
    """A new engine on the same configuration and spool (the daemon after a restart), run
    until idle and stopped; its agent and spool."""
    agent = FakeAgent()
    cfg = load_config(tmp_path / "etc", hostname="mx.test")
    spool = Spool(tmp_path / "spool", fsync=False)
    engine = create_engine(cfg, spool=spool, clock=FakeClock(), agents={"smtp": agent})
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    return agent, spool


async def _operate_then_crash(tmp_path: Path, op: Operation) -> str:
    """Start a delivery that never ends, apply ``op`` to its message, stop the daemon."""
    engine, spool, clock = _engine(tmp_path, FakeAgent(), _ONE_AT_A_TIME)
    stalled = NeverAgent()
    engine.agents = {"smtp": stalled}
    qid = _submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test", "three@a.test"])
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(stalled.started.wait(), TIMEOUT)
    assert await engine.operate(op, [qid]) == {qid: "pending"}
    engine.stop()  # the delivery in flight is cancelled after shutdown_timeout
    await asyncio.wait_for(task, TIMEOUT)
    assert spool.list_ids("active") == [qid]  # the pass never ended
    return qid


async def test_delete_of_an_active_message_survives_a_restart(tmp_path: Path) -> None:
    """delete answered 'pending', then a restart before the delivery ended: nothing is sent."""
    qid = await _operate_then_crash(tmp_path, Operation.DELETE)
    agent, spool = await _restart(tmp_path)
    assert agent.delivered == []
    for queue in ("incoming", "active", "deferred", "hold", "defer", "bounce"):
        assert qid not in spool.list_ids(queue), queue


async def test_hold_of_an_active_message_survives_a_restart(tmp_path: Path) -> None:
    """hold answered 'pending', then a restart: the message is in hold/, not delivered."""
    qid = await _operate_then_crash(tmp_path, Operation.HOLD)
    agent, spool = await _restart(tmp_path)
    assert agent.delivered == []
    assert spool.list_ids("hold") == [qid] and spool.list_ids("active") == []
    remaining = spool.open("hold", qid).read_all_recipients()
    assert sorted(r.address for r in remaining) == ["one@a.test", "three@a.test", "two@a.test"]


async def test_delete_after_hold_of_an_active_message_removes_both(tmp_path: Path) -> None:
    """hold then delete of a message in delivery: when the pass ends nothing is left."""
    engine, spool, clock = _engine(tmp_path, FakeAgent(), _ONE_AT_A_TIME)
    stalled = NeverAgent()
    engine.agents = {"smtp": stalled}
    qid = _submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test"])
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(stalled.started.wait(), TIMEOUT)
    assert await engine.operate(Operation.HOLD, [qid]) == {qid: "pending"}
    assert spool.list_ids("hold") == [qid]
    assert await engine.operate(Operation.DELETE, [qid]) == {qid: "pending"}
    assert spool.list_ids("hold") == []
    engine.stop()
    await asyncio.wait_for(task, TIMEOUT)
    agent, spool2 = await _restart(tmp_path)
    assert agent.delivered == []
    for queue in ("incoming", "active", "deferred", "hold"):
        assert spool2.list_ids(queue) == [], queue


async def _in_delivery(tmp_path: Path) -> tuple[Engine, Spool, NeverAgent, str, asyncio.Task[None]]:
    """An engine whose one message has a delivery in flight that never ends by itself."""
    engine, spool, clock = _engine(tmp_path, FakeAgent(), _ONE_AT_A_TIME)
    stalled = NeverAgent()
    engine.agents = {"smtp": stalled}
    qid = _submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test"])
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(stalled.started.wait(), TIMEOUT)
    return engine, spool, stalled, qid, task


@dataclass
class GatedAgent:
    """Starts deliveries and reports them sent once ``gate`` opens."""

    gate: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    delivered: list[str] = field(default_factory=list)

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Wait for the gate, then report every recipient sent."""
        self.started.set()
        await self.gate.wait()
        self.delivered.extend(r.address for r in request.recipients)
        return DeliveryResult(
            tuple(RecipientResult(r, Outcome.SENT, "2.0.0", "250 ok") for r in request.recipients)
        )

    async def close(self) -> None:
        """Nothing to release."""


async def test_requeue_and_release_of_an_active_message(tmp_path: Path) -> None:
    """In delivery: release is 'not found', requeue is pending and ends with the rest delivered
    after a trip through incoming/."""
    engine, spool, clock = _engine(tmp_path, FakeAgent(), _ONE_AT_A_TIME)
    agent = GatedAgent()
    engine.agents = {"smtp": agent}
    qid = _submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test"])
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(agent.started.wait(), TIMEOUT)
    assert await engine.operate(Operation.RELEASE, [qid]) == {qid: "not found"}
    assert await engine.operate(Operation.REQUEUE, [qid]) == {qid: "pending"}
    assert await engine.operate(Operation.REQUEUE, [qid]) == {qid: "pending"}  # idempotent
    agent.gate.set()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    assert sorted(agent.delivered) == ["one@a.test", "two@a.test"]
    assert engine.stats.messages_loaded == 2  # loaded again after the requeue
    for queue in ("incoming", "active", "deferred", "hold"):
        assert spool.list_ids(queue) == [], queue


async def test_hold_that_cannot_be_written_is_an_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """A hold/ entry of another file with the same id: the hold is refused with the reason."""
    engine, spool, _stalled, qid, task = await _in_delivery(tmp_path)
    spool.path("hold", qid).write_bytes(b"someone else's file")
    result = await engine.operate(Operation.HOLD, [qid])
    assert result[qid].startswith("error: cannot hold") and "exists" in result[qid]
    record = engine.ctx.table.find(qid)
    assert record is not None and record.op is None
    engine.stop()
    await asyncio.wait_for(task, TIMEOUT)
    assert spool.list_ids("active") == [qid]


async def test_requeue_after_hold_during_delivery_drops_the_hold(tmp_path: Path) -> None:
    """hold then requeue while a delivery runs: the message is not left in hold/ as well."""
    engine, spool, clock = _engine(tmp_path, FakeAgent(), _ONE_AT_A_TIME)
    agent = GatedAgent()
    engine.agents = {"smtp": agent}
    qid = _submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test"])
    task = asyncio.create_task(engine.run())
    await asyncio.wait_for(agent.started.wait(), TIMEOUT)
    assert await engine.operate(Operation.HOLD, [qid]) == {qid: "pending"}
    assert await engine.operate(Operation.REQUEUE, [qid]) == {qid: "pending"}
    assert spool.list_ids("hold") == []
    agent.gate.set()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    assert sorted(agent.delivered) == ["one@a.test", "two@a.test"]
    assert spool.list_ids("hold") == [] and spool.list_ids("incoming") == []
