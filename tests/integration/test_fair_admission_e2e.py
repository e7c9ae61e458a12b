"""Fair admission end to end over loopback: B's mail is not stuck behind A's backlog (issue 15).

The scenario is bench/fairness.py's, scaled down: A queued a 100-recipient list and 600
single-recipient messages; the active queue holds 40; B sends 8 messages over SMTP paced by
A's progress (events, no sleeps). The bound is on order, relative to the ``none`` run: how
many of A's messages reach the sink between B's commit and B's arrival. A loaded machine
changes the times, not that count.
"""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import aiosmtplib
import pytest

from bench.fairness import run_fairness
from qmgrd.daemon.admitting import REFUSE_REPLY
from tests.integration.e2e import TIMEOUT, commit, offline_spool, start_daemon
from tests.support.agents import FakeAgent
from tests.support.config import write_config

BACKLOG, LIST_RCPTS, B_MESSAGES, ACTIVE = 600, 100, 8, 40


@pytest.mark.slow
async def test_sender_domain_fairness_lets_b_past_a_backlog(tmp_path: Path) -> None:
    """none: B waits behind A's waiting backlog; sender_domain: B overtakes it and is
    passed only by what was already in core (at most about the active queue's size)."""
    runs = {}
    for key in ("none", "sender_domain"):
        runs[key] = await run_fairness(
            tmp_path / key,
            key,
            backlog=BACKLOG,
            list_rcpts=LIST_RCPTS,
            b_messages=B_MESSAGES,
            active_limit=ACTIVE,
        )
    none, fair = runs["none"], runs["sender_domain"]
    for run in (none, fair):
        assert len(run.b_latencies) == B_MESSAGES
        assert run.a_recipients == BACKLOG + LIST_RCPTS  # A lost nothing
    # none: B's first message is queued behind nearly all of A's backlog
    assert max(none.b_overtaken) >= BACKLOG // 2, none.b_overtaken
    # sender_domain: only what sat in the active queue (and in flight) goes first
    assert max(fair.b_overtaken) <= 2 * ACTIVE, fair.b_overtaken
    assert statistics.median(fair.b_overtaken) * 4 < statistics.median(none.b_overtaken)
    assert statistics.median(fair.b_latencies) < statistics.median(none.b_latencies)


async def test_backlog_limit_refuses_that_flow_only_at_mail_from(tmp_path: Path) -> None:
    """qmgr_flow_backlog_limit: MAIL FROM of a flow with that many waiting gets 452 4.3.2;
    another sender on the same connection is accepted."""
    gate = asyncio.Event()
    agent = FakeAgent(gate=gate)
    conf = write_config(
        tmp_path,
        "relayhost = [127.0.0.1]:9\n"
        "default_fairness_key = sender_domain\n"
        "qmgr_message_active_limit = 1\n"
        "qmgr_flow_backlog_limit = 3\n",
    )
    spool = offline_spool(conf)
    for i in range(4):
        commit(spool, "a@a.test", [f"a{i}@dst.test"], arrival_time=1e9)
    daemon = await start_daemon(conf, agents={"smtp": agent, "relay": agent})
    try:
        await agent.wait_started(1)  # one in core (held by the gate), three waiting
        async with aiosmtplib.SMTP(
            hostname="127.0.0.1", port=daemon.port, timeout=TIMEOUT, start_tls=False
        ) as client:
            await client.ehlo()
            refused = await client.execute_command(b"MAIL", b"FROM:<other@A.test>")
            assert (refused.code, refused.message) == (452, REFUSE_REPLY[4:])
            accepted = await client.execute_command(b"MAIL", b"FROM:<b@b.test>")
            assert accepted.code == 250
    finally:
        gate.set()
        await daemon.stop()
