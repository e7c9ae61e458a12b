"""Engine failure paths: broken agents, bugs that stop the daemon, operations during a finish."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from qmgrd.daemon.table import MessageState, MessageTable
from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, Outcome, RecipientResult
from qmgrd.delivery.dsn import compose_dsn
from qmgrd.errors import InvariantError
from qmgrd.ops.operation import Operation
from qmgrd.spool.loadread import load_queue_file
from tests.support.agents import FakeAgent, Verdict
from tests.support.engine import create_test_engine as _engine
from tests.support.engine import run_until_idle as _run_until_idle
from tests.support.engine import stop_engine as _stop
from tests.support.engine import submit as _submit

TIMEOUT = 20.0


@dataclass
class RaisingAgent:
    """An agent whose deliver raises ``error``."""

    error: BaseException
    calls: int = 0

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Raise instead of answering."""
        self.calls += 1
        raise self.error

    async def close(self) -> None:
        """Nothing to release."""


@dataclass
class ShortAgent:
    """An agent that answers only the first recipient of each request."""

    requests: list[DeliveryRequest] = field(default_factory=list)

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Report the first recipient sent and forget the others."""
        self.requests.append(request)
        first = request.recipients[0]
        return DeliveryResult((RecipientResult(first, Outcome.SENT, "2.0.0", "250 ok"),))

    async def close(self) -> None:
        """Nothing to release."""


def test_table_refuses_an_illegal_move() -> None:
    """A waiting message cannot jump to FINISHING: InvariantError names both states."""
    table = MessageTable()
    record = table.create("1K0S000000000AA", "incoming")
    assert record is not None
    with pytest.raises(InvariantError, match="illegal move from waiting to finishing"):
        table.move(record, MessageState.FINISHING)
    assert table.create("1K0S000000000AA", "deferred") is None  # one record per id
    table.done(record)
    with pytest.raises(InvariantError, match="not in the active-message table"):
        table.done(record)


async def test_agent_that_raises_defers_the_recipients(tmp_path: Path) -> None:
    """An agent exception defers every recipient with 4.3.0; the file goes to deferred/."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    agent = RaisingAgent(RuntimeError("agent bug"))
    engine.agents = {"smtp": agent}
    qid = _submit(spool, clock, "s@src.test", ["a@a.test", "b@a.test"])
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert agent.calls >= 1
    assert spool.list_ids("deferred") == [qid]
    reasons = spool.read_reasons("defer", qid)
    assert {r.address for r in reasons} == {"a@a.test", "b@a.test"}
    assert {(r.dsn, r.reason) for r in reasons} == {("4.3.0", "unknown mail transport error")}


async def test_missing_agent_defers_with_transport_unavailable(tmp_path: Path) -> None:
    """A transport with no agent: the message is deferred as 'mail transport unavailable'."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    engine.agents = {}
    qid = _submit(spool, clock, "s@src.test", ["a@a.test"])
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert spool.list_ids("deferred") == [qid]
    [reason] = spool.read_reasons("defer", qid)
    assert (reason.dsn, reason.reason) == ("4.3.0", "mail transport unavailable")


async def test_short_results_defer_the_missing_recipients(tmp_path: Path) -> None:
    """Recipients an agent gives no result for are deferred, not lost and not marked done."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    agent = ShortAgent()
    engine.agents = {"smtp": agent}
    qid = _submit(spool, clock, "s@src.test", ["a@a.test", "b@a.test", "c@a.test"])
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert spool.list_ids("deferred") == [qid]
    reasons = spool.read_reasons("defer", qid)
    assert sorted(r.address for r in reasons) == ["b@a.test", "c@a.test"]
    assert {r.reason for r in reasons} == {"delivery agent gave no result"}
    remaining = spool.open("deferred", qid).read_all_recipients()
    assert sorted(r.address for r in remaining) == ["b@a.test", "c@a.test"]


async def test_invariant_error_in_a_task_stops_the_daemon(tmp_path: Path) -> None:
    """An InvariantError raised in a delivery task ends run() with InvariantError; mail stays."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    engine.agents = {"smtp": RaisingAgent(InvariantError("broken invariant"))}
    qid = _submit(spool, clock, "s@src.test", ["a@a.test"])
    task = asyncio.create_task(engine.run())
    with pytest.raises(InvariantError, match=r"the daemon stops.*broken invariant"):
        await asyncio.wait_for(task, TIMEOUT)
    assert spool.list_ids("active") + spool.list_ids("deferred") == [qid]


async def test_invariant_error_in_a_load_stops_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load has no task of its own: an InvariantError in its callback still reaches the
    supervisor and ends run() with InvariantError; the file stays in active/."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    qid = _submit(spool, clock, "s@src.test", ["a@a.test"])

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise InvariantError("broken load")

    monkeypatch.setattr(engine.ctx.scheduler, "message_create", broken)
    task = asyncio.create_task(engine.run())
    with pytest.raises(InvariantError, match=r"the daemon stops.*broken load"):
        await asyncio.wait_for(task, TIMEOUT)
    assert spool.list_ids("active") == [qid]


def _gate_loads(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Hold every load in its worker thread: ``entered`` once one is there, it goes on at
    ``opened``."""
    entered, opened = threading.Event(), threading.Event()
    real = load_queue_file

    def gated(*args: Any) -> Any:
        entered.set()
        opened.wait(TIMEOUT)
        return real(*args)

    monkeypatch.setattr("qmgrd.daemon.loading.load_queue_file", gated)
    return entered, opened


async def test_shutdown_waits_for_a_load_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """run() returns only once a load's file work and its callback are done (no task)."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    qid = _submit(spool, clock, "s@src.test", ["a@a.test"])
    entered, opened = _gate_loads(monkeypatch)
    task = asyncio.create_task(engine.run())
    assert await asyncio.to_thread(entered.wait, TIMEOUT)
    engine.stop()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()
    opened.set()
    await asyncio.wait_for(task, TIMEOUT)
    record = engine.ctx.table.find(qid)
    assert record is not None and record.state is MessageState.IN_CORE
    assert spool.list_ids("active") == [qid]


async def test_a_bug_in_a_load_ending_at_shutdown_still_stops_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shutdown settles a load in flight before its last look at the tasks, so a bug in the
    load's callback (reported through a task) still ends run() with InvariantError. (The
    load starts once start-up's scans are over: no task of theirs keeps shutdown waiting.)"""
    engine, spool, clock = _engine(tmp_path, FakeAgent())
    task = await _run_until_idle(engine)

    def broken(*_args: Any, **_kwargs: Any) -> None:
        raise InvariantError("broken load")

    entered, opened = _gate_loads(monkeypatch)
    monkeypatch.setattr(engine.ctx.scheduler, "message_create", broken)
    qid = _submit(spool, clock, "s@src.test", ["a@a.test"])
    engine.notify_incoming(qid)
    assert await asyncio.to_thread(entered.wait, TIMEOUT)
    assert not engine.tasks.busy
    engine.stop()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()
    opened.set()
    with pytest.raises(InvariantError, match=r"the daemon stops.*broken load"):
        await asyncio.wait_for(task, TIMEOUT)
    assert spool.list_ids("active") == [qid]


@dataclass
class Gate:
    """Blocks the full notice composition (on the composer's thread) until opened."""

    opened: threading.Event = field(default_factory=threading.Event)
    entered: threading.Event = field(default_factory=threading.Event)
    calls: int = 0

    def compose(self, **kwargs: Any) -> bytes:
        """Wait (bounded) for the gate, then compose as usual."""
        self.calls += 1
        self.entered.set()
        self.opened.wait(TIMEOUT)
        return compose_dsn(**kwargs)


def _bounce_and_defer(addr: str) -> Verdict:
    if addr.startswith("bad"):
        return Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user"
    if addr.startswith("later"):
        return Outcome.DEFERRED, "4.2.0", "450 4.2.0 try later"
    return Outcome.SENT, "2.0.0", "250 ok"


async def test_hold_during_finish_is_applied(tmp_path: Path) -> None:
    """A hold that arrives while a delivered message is being finished ends with it in hold/."""
    agent = FakeAgent(rule=_bounce_and_defer)
    engine, spool, clock = _engine(tmp_path, agent)
    gate = Gate()
    engine.composer.compose_full = gate.compose
    qid = _submit(spool, clock, "sender@src.test", ["bad@a.test", "later@a.test"])
    task = asyncio.create_task(engine.run())
    assert await asyncio.to_thread(gate.entered.wait, TIMEOUT)
    record = engine.ctx.table.find(qid)
    assert record is not None and record.state is MessageState.FINISHING
    hold = asyncio.create_task(engine.operate(Operation.HOLD, [qid]))
    await asyncio.sleep(0)  # let the operation see the finish in progress
    assert not hold.done()
    gate.opened.set()
    assert await asyncio.wait_for(hold, TIMEOUT) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    assert spool.list_ids("hold") == [qid]
    assert spool.list_ids("deferred") == [] and spool.list_ids("active") == []
    assert [r.address for r in spool.open("hold", qid).read_all_recipients()] == ["later@a.test"]


async def test_invariant_error_in_an_operation_stops_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug met by an operator command is answered with the error and stops the daemon."""
    engine, _spool, _clock = _engine(tmp_path, FakeAgent())
    task = await _run_until_idle(engine)

    def broken(*_args: object) -> str:
        raise InvariantError("operation bug")

    monkeypatch.setattr("qmgrd.daemon.operations.operate_file", broken)
    with pytest.raises(InvariantError, match="operation bug"):
        await engine.operate(Operation.DELETE, ["1K0S000000000AA"])
    with pytest.raises(InvariantError, match="operation bug"):
        await asyncio.wait_for(task, TIMEOUT)
