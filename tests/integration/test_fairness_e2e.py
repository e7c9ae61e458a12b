"""Fair queuing between senders, end to end: real SMTP to a sink on 127.0.0.1.

Sender A's backlog of 300 single-recipient messages is queued before the daemon starts; once
they are all in core (and the first sessions are held at MAIL by the sink), one message from
sender B is queued. The sink then lets the sessions go: the order it sees is the scheduler's
choice alone, not load timing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration.e2e import commit, offline_spool, running_daemon
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.support.config import write_config
from tests.support.waits import wait_until

BACKLOG = 300


@pytest.mark.parametrize("key", ["sender_domain", "none"])
async def test_one_message_from_b_behind_a_backlog_of_a(tmp_path: Path, key: str) -> None:
    """With ``default_fairness_key = sender_domain`` B's message is among the first deliveries
    once the destination frees (deliveries before it: at most the 5 sessions already open plus
    a few); with ``none`` the order is nqmgr's FIFO, as today: B's message goes out after
    (nearly) all of A's backlog."""
    async with smtp_sink(SinkConfig(stall=frozenset({"MAIL"}))) as sink:
        conf = write_config(
            tmp_path,
            # the sink holds sessions at MAIL on purpose: no timeout while the test sets up
            main=f"relayhost = {sink.nexthop}\ndefault_fairness_key = {key}\n"
            "smtp_mail_timeout = 120s\n",
        )
        spool = offline_spool(conf)
        for i in range(BACKLOG):
            commit(spool, "bulk@a.test", [f"r{i}@dst.test"], arrival_time=time.time())
        async with running_daemon(conf, listen=False) as d:
            scheduler = d.engine.ctx.scheduler
            # No event reports "loaded and read into core": poll the scheduler's recipient
            # count (bounded; nothing completes while the sink holds the sessions).
            await wait_until(lambda: scheduler.rcpt_count == BACKLOG, "A's backlog in core", 60)
            await sink.wait_stalled("MAIL")
            d.enqueue("one@b.test", ["x@dst.test"])
            await wait_until(lambda: scheduler.rcpt_count == BACKLOG + 1, "B's message in core", 60)
            if key != "none":  # qmgrd status sees both flows and their backlogs
                (smtp,) = (t for t in d.engine.snapshot().transports if t.name == "smtp")
                flows = {f.label: f for f in smtp.flows}
                assert smtp.fair and smtp.flows_total == 2
                assert flows["sender_domain:a.test"].backlog == BACKLOG - 5
                assert flows["sender_domain:b.test"].backlog == 1
            sink.release()
            await d.wait_idle(timeout=60)
    senders = [m.mail_from for m in sink.messages]
    assert len(senders) == BACKLOG + 1 and senders.count("one@b.test") == 1
    before_b = senders.index("one@b.test")
    print(f"fairness key {key}: {before_b} deliveries of A before B's message")
    if key == "none":
        assert before_b >= BACKLOG - 10, before_b
    else:
        assert before_b <= 15, before_b  # 5 held sessions, then B with a few cached A sessions
