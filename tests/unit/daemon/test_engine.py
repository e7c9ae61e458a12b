"""Engine tests: the real scheduler, spool and resolver with fake agents and a fake clock."""

from __future__ import annotations

import asyncio
import email
import os
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.delivery.agent import HopStatus, Outcome
from qmgrd.spool import Envelope, QueueFile, RecipientSpec, read_content
from tests.support.agents import FakeAgent, Verdict
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit


async def test_delivers_every_recipient_once_and_empties_the_spool(tmp_path: Path) -> None:
    """50 messages, 1-7 recipients, 3 domains: each recipient delivered once, spool empty."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    expected = set()
    for i in range(50):
        rcpts = [f"u{j}@d{(i + j) % 3}.test" for j in range(1 + i % 7)]
        qid = submit(spool, clock, "s@src.test", rcpts)
        expected |= {(qid, r) for r in rcpts}
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert sorted(agent.delivered) == sorted(expected)
    for queue in ("incoming", "active", "deferred", "corrupt"):
        assert spool.list_ids(queue) == [], queue
    assert engine.stats.recipients_sent == len(expected)


async def test_deferred_recipients_are_retried_later_and_sent_ones_are_not_repeated(
    tmp_path: Path,
) -> None:
    """A 450 recipient sends the message to deferred/ (backoff mtime); the retry sends only it."""
    state = {"fail": True}

    def rule(addr: str) -> Verdict:
        if addr.startswith("later") and state["fail"]:
            return Outcome.DEFERRED, "4.2.0", "450 4.2.0 try later"
        return Outcome.SENT, "2.0.0", "250 ok"

    agent = FakeAgent(rule=rule)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["now@a.test", "later@a.test", "also@b.test"])
    task = await run_until_idle(engine)
    assert spool.list_ids("deferred") == [qid]
    mtime = spool.path("deferred", qid).stat().st_mtime
    assert mtime == pytest.approx(clock.now() + 300, abs=1)  # minimal_backoff_time
    reasons = spool.read_reasons("defer", qid)
    assert [r.address for r in reasons] == ["later@a.test"]
    assert sorted(a for _q, a in agent.delivered) == ["also@b.test", "now@a.test"]

    state["fail"] = False
    clock.advance(301)
    engine.request_deferred_scan()
    await asyncio.wait_for(engine.wait_idle(), 20)
    await stop_engine(engine, task)
    assert sorted(a for _q, a in agent.delivered) == ["also@b.test", "later@a.test", "now@a.test"]
    assert spool.list_ids("deferred") == []


async def test_bounced_recipients_produce_one_dsn_to_the_sender(tmp_path: Path) -> None:
    """Two 550 recipients give one multipart/report DSN to the sender naming both; none for <>."""

    def rule(addr: str) -> Verdict:
        if addr.startswith("bad"):
            return Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user"
        return Outcome.SENT, "2.0.0", "250 ok"

    agent = FakeAgent(rule=rule)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    submit(spool, clock, "sender@src.test", ["bad1@a.test", "good@a.test", "bad2@b.test"])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    dsn_requests = [r for r in agent.requests if r.sender == ""]
    assert len(dsn_requests) == 1
    assert [r.address for r in dsn_requests[0].recipients] == ["sender@src.test"]
    body = agent.contents[agent.requests.index(dsn_requests[0])]
    parsed = email.message_from_bytes(body)
    assert parsed.get_content_type() == "multipart/report"
    text = body.decode()
    assert "bad1@a.test" in text and "bad2@b.test" in text and "550 5.1.1 no such user" in text
    # The DSN itself (null sender) was delivered; nothing is left.
    assert ("sender@src.test") in [a for _q, a in agent.delivered]
    assert spool.list_ids("incoming") == [] and spool.list_ids("active") == []


async def test_removed_is_logged_after_the_non_delivery_notification(tmp_path: Path) -> None:
    """Postfix's order: "ID: sender non-delivery notification: NEWID", then "ID: removed"."""
    agent = FakeAgent(rule=lambda a: (Outcome.BOUNCED, "5.1.1", "550 5.1.1 no such user")
                      if a == "bad@a.test" else (Outcome.SENT, "2.0.0", "250 ok"))
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "sender@src.test", ["bad@a.test"])
    with capture_logs() as logs:
        task = await run_until_idle(engine)
        await stop_engine(engine, task)
    events = [e["event"] for e in logs if e.get("queue_id") == qid]
    notices = [i for i, e in enumerate(events) if e.startswith("sender non-delivery notification")]
    assert len(notices) == 1
    assert events[-1] == "removed" and events.count("removed") == 1
    assert notices[0] < len(events) - 1


async def test_expired_message_is_returned_and_removed(tmp_path: Path) -> None:
    """With maximal_queue_lifetime = 0 a deferral expires at once: DSN to the sender, file gone."""
    agent = FakeAgent(
        rule=lambda a: (
            (Outcome.DEFERRED, "4.4.1", "connection refused")
            if a != "sender@src.test"
            else (Outcome.SENT, "2.0.0", "250 ok")
        )
    )
    engine, spool, clock = create_test_engine(tmp_path, agent, "maximal_queue_lifetime = 0")
    submit(spool, clock, "sender@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert spool.list_ids("deferred") == []
    notices = [r for r in agent.requests if r.sender == ""]
    assert len(notices) == 1
    body = agent.contents[agent.requests.index(notices[0])].decode()
    assert "r@a.test" in body and "Status: 4.4.1" in body and "Action: failed" in body


async def test_dead_destination_defers_waiting_entries_at_once(tmp_path: Path) -> None:
    """A hop failure with window 1 kills the destination; its other entries are deferred unsent."""
    agent = FakeAgent(
        rule=lambda _a: (Outcome.DEFERRED, "4.4.1", "connect refused"),
        hop=lambda _r: HopStatus("4.4.1", "connect to a.test: Connection refused"),
    )
    engine, spool, clock = create_test_engine(
        tmp_path,
        agent,
        "initial_destination_concurrency = 1",
    )
    qids = [submit(spool, clock, "s@src.test", [f"u{i}@a.test"]) for i in range(5)]
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert len(agent.requests) == 1  # only the first was tried
    assert sorted(spool.list_ids("deferred")) == sorted(qids)
    for qid in qids:
        assert len(spool.read_reasons("defer", qid)) == 1


async def test_restart_recovers_active_and_skips_done_recipients(tmp_path: Path) -> None:
    """A file left in active/ with one recipient marked done is recovered; only the rest is sent."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["one@a.test", "two@a.test"])
    spool.move(qid, "incoming", "active")
    qf = QueueFile.open(spool.path("active", qid))
    records, _ = qf.read_recipients(qf.first_recipient_offset, 10)
    from qmgrd.spool import mark_done

    mark_done(spool.path("active", qid), [records[0].offset])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert agent.delivered == [(qid, "two@a.test")]
    assert spool.list_ids("active") == [] and spool.list_ids("incoming") == []


async def test_corrupt_file_is_quarantined_and_others_delivered(tmp_path: Path) -> None:
    """Garbage in incoming/ goes to corrupt/; a good message next to it is delivered."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    good = submit(spool, clock, "s@src.test", ["x@a.test"])
    bad = submit(spool, clock, "s@src.test", ["y@a.test"])
    path = spool.path("incoming", bad)
    path.write_bytes(b"garbage" * 3)
    os.utime(path)
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert agent.delivered == [(good, "x@a.test")]
    assert spool.list_ids("corrupt") == [bad]


async def test_content_reaches_the_agent_byte_exact(tmp_path: Path) -> None:
    """The agent streams exactly the bytes the queue file holds."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    body = b"line\r\n\x00nul\rlone\nlf\r\n" + b"x" * 5000 + b"\r\n"
    qid = submit(spool, clock, "s@src.test", ["x@a.test"], body)
    expected = read_content(spool.path("incoming", qid))
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert agent.contents == [expected]


async def test_delay_warning_is_sent_once_and_notify_never_suppresses_expiry_dsn(
    tmp_path: Path,
) -> None:
    """A due W record gives one delay notice (not again next pass); NOTIFY=NEVER gets no DSN."""
    agent = FakeAgent(
        rule=lambda a: (Outcome.SENT, "2.0.0", "250 ok")
        if a == "sender@src.test"
        else (Outcome.DEFERRED, "4.4.1", "connection refused")
    )
    engine, spool, clock = create_test_engine(tmp_path, agent)
    warned = spool.commit(
        Envelope(
            sender="sender@src.test",
            recipients=(RecipientSpec("r@a.test"),),
            arrival_time=clock.now(),
            warn_time=int(clock.now()),
        ),
        b"Subject: slow\r\n\r\nbody\r\n",
    )
    task = await run_until_idle(engine)
    notices = [r for r in agent.requests if r.sender == ""]
    assert len(notices) == 1
    body = agent.contents[agent.requests.index(notices[0])].decode()
    assert "delayed" in body.lower() and "r@a.test" in body
    assert spool.list_ids("deferred") == [warned]
    clock.advance(400)
    engine.request_deferred_scan()
    await asyncio.wait_for(engine.wait_idle(), 20)
    assert len([r for r in agent.requests if r.sender == ""]) == 1  # warned once only
    await stop_engine(engine, task)

    agent2 = FakeAgent(rule=lambda _a: (Outcome.DEFERRED, "4.4.1", "connection refused"))
    (tmp_path / "two").mkdir()
    engine2, spool2, clock2 = create_test_engine(
        tmp_path / "two", agent2, "maximal_queue_lifetime = 0"
    )
    spool2.commit(
        Envelope(
            sender="sender@src.test",
            recipients=(RecipientSpec("quiet@a.test", notify=frozenset({"NEVER"})),),
            arrival_time=clock2.now(),
        ),
        b"Subject: x\r\n\r\nbody\r\n",
    )
    task2 = await run_until_idle(engine2)
    await stop_engine(engine2, task2)
    assert [r for r in agent2.requests if r.sender == ""] == []
    assert spool2.list_ids("deferred") == [] and spool2.list_ids("incoming") == []


async def test_startup_removes_reason_logs_of_vanished_messages(tmp_path: Path) -> None:
    """A defer log left behind by a crash after its message was removed is deleted at start."""
    agent = FakeAgent()
    engine, spool, clock = create_test_engine(tmp_path, agent)
    kept = submit(spool, clock, "s@src.test", ["x@a.test"])
    spool.move(kept, "incoming", "hold")
    from qmgrd.spool import ReasonRecord

    record = ReasonRecord("x@a.test", "4.4.1", "delayed", "refused", clock.now())
    spool.append_reasons("defer", kept, [record])
    spool.append_reasons("defer", "1K0S000000000AA", [record])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert spool.list_ids("defer") == [kept]
