"""Fair admission in the engine: flows of waiting files, per-flow limits from main.cf (issue 15)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from qmgrd.core.admission import FlowBacklog
from qmgrd.daemon.admitting import EngineFlowGate, read_flow_facts
from qmgrd.daemon.metrics import Metrics
from qmgrd.listener.flowgate import FlowFacts
from qmgrd.ops.status import format_status
from tests.support.agents import FakeAgent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit
from tests.support.waits import TIMEOUT


async def _delivery_order(tmp_path: Path, main: str) -> list[str]:
    """A's five messages then B's one, queued before the start; one message in core at a time.
    Returns the senders in delivery order."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(
        tmp_path, agent, "qmgr_message_active_limit = 1\n" + main
    )
    for i in range(5):
        submit(spool, clock, "a@a.test", [f"a{i}@dst.test"])
    submit(spool, clock, "b@b.test", ["b@dst.test"])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    return [r.sender for r in agent.requests]


async def test_fairness_none_loads_in_scan_order(tmp_path: Path) -> None:
    """none (the default): B's message waits for all of A's, as in Postfix."""
    senders = await _delivery_order(tmp_path, "")
    assert senders == ["a@a.test"] * 5 + ["b@b.test"]


async def test_sender_domain_lets_b_in_before_a_backlog(tmp_path: Path) -> None:
    """sender_domain: the start-up scan reads each file's envelope head; B goes second."""
    senders = await _delivery_order(tmp_path, "default_fairness_key = sender_domain\n")
    assert senders[:2] == ["a@a.test", "b@b.test"]
    assert senders.count("a@a.test") == 5


async def test_flow_active_limit_and_rate_from_main_cf(tmp_path: Path) -> None:
    """qmgr_flow_active_limit holds a flow at its cap; qmgr_flow_message_rate_limit per
    qmgr_flow_rate_time_unit paces it (burst = the limit), on the engine's clock."""
    gate = asyncio.Event()
    agent = FakeAgent(gate=gate)
    engine, spool, clock = create_test_engine(
        tmp_path,
        agent,
        "default_fairness_key = sender_domain\n"
        "qmgr_flow_active_limit = 2\n"
        "qmgr_flow_message_rate_limit = 3\n"
        "qmgr_flow_rate_time_unit = 30s\n",
    )
    for i in range(6):
        submit(spool, clock, "a@a.test", [f"a{i}@dst.test"])
    task = asyncio.create_task(engine.run())
    stats = engine.stats
    await asyncio.wait_for(engine.wait_until(lambda: stats.messages_loaded == 2), TIMEOUT)
    assert engine.snapshot().admission == (FlowBacklog("sender_domain:a.test", 4, 2),)
    scrape = Metrics(status_fn=engine.snapshot).generate()
    assert b'qmgrd_flow_messages_waiting{flow="sender_domain:a.test"} 4.0' in scrape
    assert b'qmgrd_flow_messages_active{flow="sender_domain:a.test"} 2.0' in scrape
    gate.set()  # deliveries finish: the cap frees, the rate allows one more (burst 3)
    await asyncio.wait_for(
        engine.wait_until(lambda: stats.messages_loaded == 3 and stats.messages_removed == 3),
        TIMEOUT,
    )
    assert engine.ctx.table.admission.next_deadline() == clock.now() + 10.0  # 30 s / 3
    clock.advance(10.0)
    engine.wakeup()
    await asyncio.wait_for(engine.wait_until(lambda: stats.messages_removed == 4), TIMEOUT)
    assert stats.messages_loaded == 4
    text = format_status({"pid": 1, **engine.status()})
    assert "sender_domain:a.test" in text and "admission:" in text
    await stop_engine(engine, task)


async def test_gate_hands_the_flow_without_reading_the_file(tmp_path: Path) -> None:
    """committed(queue_id, facts) queues the id under the facts' flow at once (no head read:
    the file need not even exist yet); read_flow_facts gives None for an unreadable file."""
    agent = FakeAgent()
    engine, spool, _clock = create_test_engine(
        tmp_path, agent, "default_fairness_key = sender\n"
    )
    gate = EngineFlowGate(engine)
    gate.committed("1K0S000000000AB", FlowFacts("Someone@x.test", "192.0.2.1"))
    record = engine.ctx.table.find("1K0S000000000AB")
    assert record is not None and record.flow.key == "sender:someone@x.test"
    assert gate.refuse(FlowFacts("someone@x.test")) is None  # no backlog limit set
    assert read_flow_facts(spool, "incoming", ["1K0S000000000AB"]) == [
        ("1K0S000000000AB", None)
    ]


async def test_fairness_none_reads_no_envelope_head(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fairness none the scans queue ids as listed: no file is opened for its flow."""

    def refuse(*_args: object) -> None:
        raise AssertionError("an envelope head was read with fairness none")

    monkeypatch.setattr("qmgrd.daemon.loading.read_flow_facts", refuse)
    senders = await _delivery_order(tmp_path, "")
    assert len(senders) == 6
