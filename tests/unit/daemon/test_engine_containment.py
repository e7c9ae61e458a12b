"""Containment: a message whose notice or finish fails or hangs never stops other mail."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from qmgrd.core.resolve import Resolved, Resolver
from qmgrd.daemon.engine import Engine
from qmgrd.daemon.notices import COMPOSE_MAX_THREADS, PoolBusy, ThreadPool
from qmgrd.daemon.table import MessageState
from qmgrd.delivery.agent import Outcome
from qmgrd.ops.operation import Operation
from qmgrd.spool import QueueFile, loadread, records
from tests.support.agents import FakeAgent, Verdict
from tests.support.engine import create_test_engine as _engine
from tests.support.engine import fail_early_removal
from tests.support.engine import run_until_idle as _run_until_idle
from tests.support.engine import stop_engine as _stop
from tests.support.engine import submit as _submit

TIMEOUT = 20.0


def _bounce_bad(addr: str) -> Verdict:
    if addr.startswith("bad"):
        return Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user"
    return Outcome.SENT, "2.0.0", "250 ok"


def _notices(agent: FakeAgent) -> list[bytes]:
    return [agent.contents[i] for i, r in enumerate(agent.requests) if r.sender == ""]


def _raise(**_kwargs: Any) -> bytes:
    raise ValueError("header folding exploded")


async def test_a_composer_that_raises_still_bounces_and_others_flow(tmp_path: Path) -> None:
    """compose_dsn raising: the sender gets a minimal notice; other mail is delivered."""
    agent = FakeAgent(rule=_bounce_bad)
    engine, spool, clock = _engine(tmp_path, agent)
    engine.composer.compose_full = _raise
    poison = _submit(spool, clock, "sender@src.test", ["bad@a.test"])
    good = [_submit(spool, clock, "s@src.test", [f"ok{i}@b.test"]) for i in range(3)]
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    [notice] = _notices(agent)
    text = notice.decode("ascii")
    assert "bad@a.test" in text and "550 5.1.1 no such user" in text
    assert "could not be attached" in text and f"X-Queue-ID: {poison}" in text
    assert {q for q, _a in agent.delivered} >= set(good)
    for queue in ("incoming", "active", "deferred", "bounce"):
        assert spool.list_ids(queue) == [], queue


async def test_a_hanging_composer_times_out_and_stop_completes(tmp_path: Path) -> None:
    """A composition that never returns: minimal notice after the bound; stop stays prompt."""
    agent = FakeAgent(rule=_bounce_bad)
    engine, spool, clock = _engine(tmp_path, agent)
    never = threading.Event()
    calls: list[int] = []

    def hang(**_kwargs: Any) -> bytes:
        calls.append(1)
        never.wait(TIMEOUT)  # a parser loop; released when the test ends
        raise AssertionError("unreachable in time")

    engine.composer.compose_full = hang
    engine.composer.timeout = 0.2
    engine.composer.queue_timeout = 0.5
    try:
        for _ in range(3):
            _submit(spool, clock, "sender@src.test", ["bad@a.test"])
        good = _submit(spool, clock, "s@src.test", ["ok@b.test"])
        task = await _run_until_idle(engine)
        assert len(_notices(agent)) == 3
        assert all(b"could not be attached" in n for n in _notices(agent))
        assert (good, "ok@b.test") in agent.delivered
        assert len(calls) <= COMPOSE_MAX_THREADS  # stuck threads are bounded
        await asyncio.wait_for(_stop(engine, task), 5)
    finally:
        never.set()
    assert spool.list_ids("active") == [] and spool.list_ids("incoming") == []


async def test_stop_is_prompt_while_a_composition_hangs(tmp_path: Path) -> None:
    """SIGTERM while a notice composition hangs: run() returns within shutdown_timeout."""
    agent = FakeAgent(rule=_bounce_bad)
    engine, spool, clock = _engine(tmp_path, agent, "shutdown_timeout = 1s")
    never = threading.Event()
    entered = threading.Event()

    def hang(**_kwargs: Any) -> bytes:
        entered.set()
        never.wait(TIMEOUT)
        raise AssertionError("unreachable in time")

    engine.composer.compose_full = hang
    engine.composer.timeout = 60.0
    qid = _submit(spool, clock, "sender@src.test", ["bad@a.test"])
    task = asyncio.create_task(engine.run())
    try:
        assert await asyncio.to_thread(entered.wait, TIMEOUT)
        engine.stop()
        await asyncio.wait_for(task, 5)
    finally:
        never.set()
    assert spool.list_ids("active") == [qid]  # nothing lost: the next start recovers it
    assert spool.read_reasons("bounce", qid) != []


async def _until(engine: Engine, predicate: Any) -> None:
    await asyncio.wait_for(engine.wait_until(predicate), TIMEOUT)


def _state(engine: Engine, qid: str) -> MessageState | None:
    record = engine.ctx.table.find(qid)
    return None if record is None else record.state


async def test_a_finish_that_raises_is_retried_and_others_flow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in one finish: logged, the message retried after retry_delay, the rest delivered."""
    agent = FakeAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    real = engine.finisher._complete
    failures: list[str] = []

    def flaky(msg: Any, *args: Any) -> Any:
        if msg.queue_id == first and not failures:
            failures.append(msg.queue_id)
            raise RuntimeError("finish bug")
        return real(msg, *args)

    monkeypatch.setattr(engine.finisher, "_complete", flaky)
    fail_early_removal(monkeypatch)  # the finisher's own steps run (and fail)
    first = _submit(spool, clock, "s@src.test", ["one@a.test"])
    task = asyncio.create_task(engine.run())
    await _until(engine, lambda: _state(engine, first) is MessageState.RETRY)
    assert spool.list_ids("active") == [first]
    later = _submit(spool, clock, "s@src.test", ["two@a.test"])
    engine.notify_incoming(later)
    await _until(
        engine, lambda: (later, "two@a.test") in agent.delivered and _state(engine, later) is None
    )
    clock.advance(engine.retry_delay)
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    assert failures == [first]
    assert spool.list_ids("active") == [] and spool.list_ids("deferred") == []


async def test_a_finish_that_keeps_failing_ends_deferred_with_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After repeated finish failures the message goes to deferred/ with a 4.3.0 reason."""
    agent = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.2.0", "450 later"))
    engine, spool, clock = _engine(tmp_path, agent)

    def broken(*_args: Any) -> Any:
        raise RuntimeError("finish bug")

    monkeypatch.setattr(engine.finisher, "_complete", broken)
    qid = _submit(spool, clock, "s@src.test", ["r@a.test"])
    task = asyncio.create_task(engine.run())
    for failures in (1, 2, 3):
        await _until(engine, lambda n=failures: _failures(engine, qid) == n)
        clock.advance(engine.retry_delay * 2 ** (failures - 1))
        engine.wakeup()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    assert spool.list_ids("deferred") == [qid] and spool.list_ids("active") == []
    reasons = spool.read_reasons("defer", qid)
    assert any(r.dsn == "4.3.0" and "internal error" in r.reason for r in reasons)


def _failures(engine: Engine, qid: str) -> int:
    record = engine.ctx.table.find(qid)
    return -1 if record is None or record.state is not MessageState.RETRY else record.failures


async def test_delete_of_a_message_whose_finish_fails_really_deletes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """qmgrd delete of a message stuck retrying its finish removes the file from active/."""
    engine, spool, clock = _engine(tmp_path, FakeAgent())

    def broken(*_args: Any) -> Any:
        raise RuntimeError("finish bug")

    monkeypatch.setattr(engine.finisher, "_complete", broken)
    fail_early_removal(monkeypatch)
    qid = _submit(spool, clock, "s@src.test", ["r@a.test"])
    task = asyncio.create_task(engine.run())
    await _until(engine, lambda: _state(engine, qid) is MessageState.RETRY)
    assert await engine.operate(Operation.DELETE, [qid]) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await _stop(engine, task)
    for queue in ("incoming", "active", "deferred", "hold"):
        assert spool.list_ids(queue) == [], queue


async def test_a_resolver_failure_defers_only_that_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception resolving one message's recipients defers it (4.3.0); others are sent."""
    agent = FakeAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    real = Resolver.resolve

    def resolve(
        self: Resolver, address: str, *, flush: bool = False, sender: str | None = None
    ) -> Resolved:
        if address.startswith("evil"):
            raise UnicodeError("unexpected address")
        return real(self, address, flush=flush, sender=sender)

    monkeypatch.setattr(Resolver, "resolve", resolve)
    evil = _submit(spool, clock, "s@src.test", ["evil@a.test"])
    good = _submit(spool, clock, "s@src.test", ["fine@a.test"])
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert agent.delivered == [(good, "fine@a.test")]
    assert spool.list_ids("deferred") == [evil]
    [reason] = spool.read_reasons("defer", evil)
    assert reason.dsn == "4.3.0" and "cannot resolve recipients" in reason.reason


async def test_a_parser_exception_quarantines_only_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception parsing one queue file sends it to corrupt/; the rest flows."""
    agent = FakeAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    bad = _submit(spool, clock, "s@src.test", ["x@a.test"])
    good = _submit(spool, clock, "s@src.test", ["y@a.test"])
    real = QueueFile.parse

    def parse(f: BinaryIO, path: Path, size: int) -> QueueFile:
        if path.name == bad:
            raise IndexError("parser bug")
        return real(f, path, size)

    def whole(data: bytes, path: Path) -> QueueFile | None:
        if path.name == bad:
            raise IndexError("parser bug")
        return None  # the record stream parses the others

    monkeypatch.setattr(QueueFile, "parse", staticmethod(parse))
    monkeypatch.setattr(loadread, "_envelope", whole)  # a file read whole
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert agent.delivered == [(good, "y@a.test")]
    assert spool.list_ids("corrupt") == [bad]


async def test_a_reader_exception_defers_only_that_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception reading one message's recipients defers it with 4.3.0."""
    agent = FakeAgent()
    engine, spool, clock = _engine(tmp_path, agent)
    bad = _submit(spool, clock, "s@src.test", ["x@a.test"])
    good = _submit(spool, clock, "s@src.test", ["y@a.test"])
    real = records.recipients_from
    calls: list[int] = []

    def read(f: BinaryIO, size: int, path: Path, offset: int, limit: int) -> Any:
        if path.name == bad and not calls:
            calls.append(1)
            raise MemoryError("reader bug")
        return real(f, size, path, offset, limit)

    def whole(data: bytes, offset: int, limit: int) -> Any:
        if b"x@a.test" in data and not calls:
            calls.append(1)
            raise MemoryError("reader bug")
        return None  # the record stream reads the others

    monkeypatch.setattr(loadread, "recipients_from", read)  # the load's first read
    monkeypatch.setattr(loadread, "_recipients", whole)  # ... of a file read whole
    task = await _run_until_idle(engine)
    await _stop(engine, task)
    assert agent.delivered == [(good, "y@a.test")]
    assert spool.list_ids("deferred") == [bad]
    [reason] = spool.read_reasons("defer", bad)
    assert reason.dsn == "4.3.0" and "cannot read recipients" in reason.reason


async def test_the_notice_pool_writes_off_stuck_threads_and_then_refuses_at_once() -> None:
    """A stuck job's thread is replaced up to max_threads; then submit fails immediately."""
    pool = ThreadPool(workers=1, max_threads=2, backlog=8)
    release = threading.Event()

    def stuck() -> bytes:
        release.wait(TIMEOUT)
        return b"late"

    try:
        first = pool.submit(stuck)
        await asyncio.wait_for(asyncio.shield(first.started), TIMEOUT)
        waiting = pool.submit(lambda: b"ok")  # queued behind the stuck job
        pool.abandon(first)  # a replacement thread takes the waiting job
        assert await asyncio.wait_for(asyncio.shield(waiting.result), TIMEOUT) == b"ok"
        second = pool.submit(stuck)
        await asyncio.wait_for(asyncio.shield(second.started), TIMEOUT)
        queued = pool.submit(lambda: b"never")
        pool.abandon(second)
        assert pool.jammed
        with pytest.raises(PoolBusy):
            await queued.started  # failed at once: nobody would ever take it
        refused = pool.submit(lambda: b"never")
        with pytest.raises(PoolBusy):
            await refused.started
    finally:
        release.set()
