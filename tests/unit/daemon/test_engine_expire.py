"""qmgrd expire (postsuper -e): a marked message is returned to its sender at the next look."""

from __future__ import annotations

import asyncio
import email
import io
import os
import re
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.delivery.agent import Outcome
from qmgrd.log.render import render_postfix
from qmgrd.ops.operation import Operation
from qmgrd.ops.postsuper import operate_command
from qmgrd.spool import Spool, is_forced_expire
from qmgrd.spool.mailq import scan_queue
from tests.support.agents import FakeAgent, Verdict, stalled_agent
from tests.support.engine import create_test_engine, run_until_idle, stop_engine, submit

TIMEOUT = 20.0


def _later(_addr: str) -> Verdict:
    return Outcome.DEFERRED, "4.2.0", "450 4.2.0 try later"


def _notices(agent: FakeAgent) -> list[bytes]:
    return [agent.contents[i] for i, r in enumerate(agent.requests) if r.sender == ""]


def _marked(spool: Spool, queue: str, qid: str) -> bool:
    return is_forced_expire(os.stat(spool.path(queue, qid)).st_mode)


async def test_expire_of_a_deferred_message_returns_it_now(tmp_path: Path) -> None:
    """Through the engine: a deferred message is marked, loaded at once and returned with
    Postfix's 'administratively expired' reason, never delivered; nothing is left queued."""
    agent = FakeAgent(rule=_later)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "sender@src.test", ["r1@a.test", "r2@a.test"])
    task = await run_until_idle(engine)
    assert spool.list_ids("deferred") == [qid]
    agent.rule = lambda addr: (Outcome.SENT, "2.0.0", "250 ok")
    with capture_logs() as logs:
        assert await engine.operate(Operation.EXPIRE, [qid]) == {qid: "ok"}
        await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    for queue in ("incoming", "active", "deferred", "hold", "defer"):
        assert spool.list_ids(queue) == [], queue
    assert [a for _q, a in agent.delivered if a != "sender@src.test"] == []  # never delivered
    [notice] = _notices(agent)
    text = notice.decode()
    assert "r1@a.test" in text and "r2@a.test" in text
    assert "message is administratively expired" in text
    assert [e["queue_id"] for e in logs if e["event"] == Operation.EXPIRE.log] == [qid]
    expired = [e for e in logs if e["event"] == "expired"]
    assert {e["to"] for e in expired} == {"<r1@a.test>", "<r2@a.test>"}


async def test_expire_of_a_message_in_delivery_returns_what_is_left(tmp_path: Path) -> None:
    """In core: the mark is on disk at once (ok); the delivery in flight ends, no other
    starts, and the recipients left are returned as administratively expired."""
    agent = stalled_agent()
    engine, spool, clock = create_test_engine(
        tmp_path,
        FakeAgent(),
        "smtp_destination_recipient_limit = 2\n"
        "smtp_initial_destination_concurrency = 1\nsmtp_destination_concurrency_limit = 1",
    )
    engine.agents = {"smtp": agent, "relay": agent}
    qid = submit(spool, clock, "s@src.test", [f"u{i}@a.test" for i in range(6)])
    task = asyncio.create_task(engine.run())
    await agent.wait_started(1)
    assert await engine.operate(Operation.EXPIRE, [qid]) == {qid: "ok"}
    assert _marked(spool, "active", qid)
    agent.release()
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    delivered = {a for q, a in agent.delivered if q == qid}
    assert len(delivered) == 2  # only the entry in flight when the mark came
    [notice] = _notices(agent)
    text = notice.decode()
    assert "message is administratively expired" in text
    assert all(f"u{i}@a.test" in text for i in range(6) if f"u{i}@a.test" not in delivered)
    assert spool.list_ids("active") == [] and spool.list_ids("deferred") == []


async def test_expire_of_a_held_message_keeps_it_held(tmp_path: Path) -> None:
    """A held message is marked but stays in hold/ (never delivered from there); released,
    it is returned to the sender instead of delivered."""
    agent = FakeAgent(rule=_later)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    assert await engine.operate(Operation.HOLD, [qid]) == {qid: "ok"}
    assert await engine.operate(Operation.EXPIRE, [qid]) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    assert spool.list_ids("hold") == [qid] and _marked(spool, "hold", qid)
    assert _notices(agent) == []
    assert await engine.operate(Operation.RELEASE, [qid]) == {qid: "ok"}
    await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
    await stop_engine(engine, task)
    assert len(_notices(agent)) == 1
    assert spool.list_ids("hold") == [] and qid not in spool.list_ids("deferred")


async def test_offline_expire_marks_and_the_next_start_returns(tmp_path: Path) -> None:
    """Without a daemon, qmgrd expire marks the file (mailq --json: forced_expire) and makes a
    deferred one due; the daemon's next start returns it without delivering it."""
    agent = FakeAgent(rule=_later)
    engine, spool, clock = create_test_engine(tmp_path, agent)
    qid = submit(spool, clock, "s@src.test", ["r@a.test"])
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert spool.list_ids("deferred") == [qid]
    assert os.stat(spool.path("deferred", qid)).st_mtime > clock.now()  # not due yet
    out, err = io.StringIO(), io.StringIO()
    code = operate_command(
        spool.root, "expire", [qid], stdin=io.StringIO(), out=out, err=err, now=clock.now()
    )
    assert (code, out.getvalue(), err.getvalue()) == (0, "qmgrd: Expired: 1 message\n", "")
    assert _marked(spool, "deferred", qid)
    assert os.stat(spool.path("deferred", qid)).st_mtime <= clock.now()
    assert [m.forced_expire for m in scan_queue(spool)] == [True]
    engine, spool, clock = create_test_engine(tmp_path, agent)
    task = await run_until_idle(engine)
    await stop_engine(engine, task)
    assert len(_notices(agent)) == 1
    assert [r for r in agent.requests if r.sender != ""][1:] == []  # no second delivery try
    assert qid not in spool.list_ids("deferred")


def _recipient_fields(notice: bytes) -> list[dict[str, str]]:
    """The per-recipient field groups of a notice's message/delivery-status part."""
    parsed = email.message_from_bytes(notice)
    [status] = [p for p in parsed.walk() if p.get_content_type() == "message/delivery-status"]
    groups = status.get_payload()
    assert isinstance(groups, list)
    return [{k: str(v) for k, v in g.items()} for g in groups[1:] if not isinstance(g, str)]


@pytest.mark.parametrize(
    ("forced", "dsn", "reason"),
    [
        (False, "4.4.1", "connect to a.test: refused"),
        (True, "4.7.0", "message is administratively expired"),  # Postfix's postsuper -e
    ],
)
async def test_expiry_keeps_the_4xx_status_and_logs_like_postfix(
    tmp_path: Path, forced: bool, dsn: str, reason: str
) -> None:
    """An expired message: DSN with Action: failed and the 4.x.x Status; log lines per
    recipient (dsn=4.x.x, delay=, delays=), Postfix's message line, notice, removed last."""
    agent = FakeAgent(rule=lambda a: (Outcome.DEFERRED, "4.4.1", "connect to a.test: refused"))
    lifetime = "1d" if forced else "0"
    engine, spool, clock = create_test_engine(
        tmp_path, agent, f"maximal_queue_lifetime = {lifetime}"
    )
    qid = submit(spool, clock, "sender@src.test", ["r1@a.test", "r2@a.test"])
    with capture_logs() as logs:
        task = await run_until_idle(engine)
        if forced:
            assert spool.list_ids("deferred") == [qid]
            assert await engine.operate(Operation.EXPIRE, [qid]) == {qid: "ok"}
            await asyncio.wait_for(engine.wait_idle(), TIMEOUT)
        await stop_engine(engine, task)
    [notice] = _notices(agent)
    fields = _recipient_fields(notice)
    assert [(f["Final-Recipient"], f["Action"], f["Status"]) for f in fields] == [
        ("rfc822; r1@a.test", "failed", dsn),
        ("rfc822; r2@a.test", "failed", dsn),
    ]
    mine = [e for e in logs if e.get("queue_id") == qid]
    expired = [e for e in mine if e["event"] == "expired"]
    assert [(e["to"], e["dsn"]) for e in expired] == [("<r1@a.test>", dsn), ("<r2@a.test>", dsn)]
    line = render_postfix(dict(expired[0]))
    assert re.fullmatch(
        qid + r": to=<r1@a\.test>, relay=[^,]+, delay=[\d.]+, delays=[\d.]+/[\d.]+/0/0, "
        rf"dsn={re.escape(dsn)}, status=expired, returned to sender \({re.escape(reason)}\)",
        line,
    ), line
    [returned] = [e for e in mine if e["event"] == "returned"]
    word = "force-expired" if forced else "expired"
    assert render_postfix({k: v for k, v in returned.items() if k != "log_level"}) == (
        f"{qid}: from=<sender@src.test>, status={word}, returned to sender"
    )
    tail = [e["event"] for e in mine][-4:]
    assert tail[:2] == ["expired", "returned"]
    assert tail[2].startswith("sender non-delivery notification: ")
    assert tail[3] == "removed"  # Postfix: removed is the message's last line
