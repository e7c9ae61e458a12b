"""Engine control operations (hold/release/delete/requeue, flush, status) and reload."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qmgrd.daemon.assemble import reload_engine
from qmgrd.delivery.agent import Outcome
from qmgrd.ops.operation import Operation
from tests.support.agents import FakeAgent, stalled_agent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


async def test_hold_and_release_of_a_deferred_message(tmp_path: Path) -> None:
    """A deferred message is held (moved to hold/), then released and delivered."""
    state = {"fail": True}

    def rule(_addr: str) -> tuple[Outcome, str, str]:
        if state["fail"]:
            return Outcome.DEFERRED, "4.2.0", "450 later"
        return Outcome.SENT, "2.0.0", "250 ok"

    agent = FakeAgent(rule=rule)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    assert spool.list_ids("deferred") == [qid]
    assert await engine.operate(Operation.HOLD, [qid]) == {qid: "ok"}
    assert spool.list_ids("hold") == [qid] and spool.list_ids("deferred") == []
    state["fail"] = False
    assert await engine.operate(Operation.RELEASE, None) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    assert ("r@a.test") in [a for _q, a in agent.delivered]
    assert spool.list_ids("hold") == [] and spool.list_ids("deferred") == []


async def test_hold_of_an_active_message_waits_for_the_delivery_in_flight(
    tmp_path: Path,
) -> None:
    """Hold of an active message: the delivery in flight ends, no other starts, file in hold/."""
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(
        tmp_path,
        FakeAgent(),
        "smtp_destination_recipient_limit = 2\n"
        "smtp_initial_destination_concurrency = 1\nsmtp_destination_concurrency_limit = 1",
    )
    engine.agents = {"smtp": agent}
    qid = submit(spool, clock, "s@src.test", [f"u{i}@a.test" for i in range(6)])
    task = asyncio.create_task(engine.run())
    await agent.wait_started(1)
    assert await engine.operate(Operation.HOLD, [qid]) == {qid: "pending"}
    agent.release()
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    assert len(agent.requests) == 1
    assert len(agent.delivered) == 2
    assert spool.list_ids("hold") == [qid]
    # The two delivered recipients were marked done; the held file keeps the other four.
    qf = spool.open("hold", qid)
    remaining = [r.address for r in qf.read_all_recipients()]
    assert sorted(remaining) == sorted(
        {f"u{i}@a.test" for i in range(6)} - {a for _q, a in agent.delivered}
    )


async def test_delete_and_requeue(tmp_path: Path) -> None:
    """delete removes a deferred message and its logs; requeue sends a held one through incoming."""
    agent = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.2.0", "450 later"))
    engine, spool, clock = create_test_engine(tmp_path, agent)
    first = submit(spool, clock, "s@src.test", ["r@a.test"])
    second = submit(spool, clock, "s@src.test", ["q@a.test"])
    task = await run_until_idle(engine)
    assert sorted(spool.list_ids("deferred")) == sorted([first, second])
    assert await engine.operate(Operation.DELETE, [first, "0000000000000ZZ"]) == {
        first: "ok",
        "0000000000000ZZ": "not found",
    }
    assert spool.read_reasons("defer", first) == []
    agent.rule = lambda _a: (Outcome.SENT, "2.0.0", "250 ok")
    assert await engine.operate(Operation.REQUEUE, [second]) == {second: "ok"}
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    assert [a for q, a in agent.delivered] == ["q@a.test"]
    assert spool.list_ids("deferred") == []


async def test_flush_message_and_status(tmp_path: Path) -> None:
    """flush -i retries one deferred message at once; status reports the core as JSON values."""
    state = {"fail": True}
    agent = FakeAgent(
        rule=lambda _a: (
            (Outcome.DEFERRED, "4.2.0", "450 later")
            if state["fail"]
            else (Outcome.SENT, "2.0.0", "250 ok")
        )
    )
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    status = engine.status()
    assert status["messages_in_core"] == 0
    assert status["stats"]["recipients_deferred"] == 1
    state["fail"] = False
    assert await engine.flush_message(qid) is True
    assert await engine.flush_message("0000000000000ZZ") is False
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    assert agent.delivered == [(qid, "r@a.test")]


async def test_reload_changes_the_window_cap_of_a_live_destination(tmp_path: Path) -> None:
    """A reload with a lower concurrency limit clamps a live queue; a broken main.cf is refused."""
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(
        tmp_path, FakeAgent(), "smtp_destination_recipient_limit = 2"
    )
    engine.agents = {"smtp": agent}
    submit(spool, clock, "s@src.test", [f"u{i}@a.test" for i in range(12)])
    task = asyncio.create_task(engine.run())
    await agent.wait_started(5)  # 6 entries, initial concurrency 5
    conf = tmp_path / "etc" / "main.cf"
    conf.write_text(conf.read_text() + "smtp_destination_concurrency_limit = 2\n")
    assert reload_engine(engine, tmp_path / "etc") is not None
    transport = engine.scheduler.find_transport("smtp")
    assert transport is not None
    assert transport.params.destination_concurrency_limit == 2
    assert transport.queues["a.test"].window.window == 2
    conf.write_text(conf.read_text() + "soft_bounce = maybe\n")
    assert reload_engine(engine, tmp_path / "etc") is None
    assert transport.params.destination_concurrency_limit == 2
    agent.release()
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)


@pytest.mark.parametrize("op", [Operation.HOLD, Operation.DELETE, Operation.REQUEUE])
async def test_operations_on_unknown_ids_report_not_found(tmp_path: Path, op: Operation) -> None:
    """An id that is nowhere in the spool is reported, not an error."""
    engine, _spool, _clock = create_test_engine(tmp_path, FakeAgent())
    task = await run_until_idle(engine)
    assert await engine.operate(op, ["0000000000000ZZ"]) == {"0000000000000ZZ": "not found"}
    await stop_engine(engine, task)


async def test_reload_turns_fair_queuing_on_for_new_and_live_mail(tmp_path: Path) -> None:
    """A reload that sets default_fairness_key gives the live transport a fair set holding the
    messages in core, and messages loaded afterwards get flows by the new key; a weight table
    with a bad value is refused and changes nothing."""
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(tmp_path, FakeAgent())
    engine.agents = {"smtp": agent}
    submit(spool, clock, "s@a.test", [f"u{i}@x.test" for i in range(12)])
    task = asyncio.create_task(engine.run())
    await agent.wait_started(1)
    transport = engine.scheduler.find_transport("smtp")
    assert transport is not None and transport.fair is None
    conf = tmp_path / "etc" / "main.cf"
    conf.write_text(conf.read_text() + "default_fairness_key = sender_domain\n")
    assert reload_engine(engine, tmp_path / "etc") is not None
    assert engine.ctx.fairness.default_key == "sender_domain"
    assert transport.fair is not None
    assert transport.fair.flows == {}  # the one entry in core is in flight: its job is retired
    engine.agents = {"smtp": agent}  # the reload made real agents: keep the stalled one
    qid = submit(spool, clock, "t@b.test", ["v@y.test"])
    engine.notify_incoming(qid)
    await agent.wait_started(2)
    message = engine.scheduler.find_message(qid)
    assert message is not None and message.flow.key == "sender_domain:b.test"
    (entry,) = transport.queues["y.test"].busy
    assert entry.fair is not None  # charged to its flow's fair queue (the first one was not)
    assert transport.fair.executing == 1
    (tmp_path / "etc" / "w").write_text("b.test heavy\n")
    conf.write_text(conf.read_text() + "fairness_weight_maps = texthash:w\n")
    assert reload_engine(engine, tmp_path / "etc") is None
    assert engine.ctx.fairness.weights is None
    agent.release()
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
