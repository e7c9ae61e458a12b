"""Scheduling seen from outside: dead destinations, preemption and connection reuse, end to end.

The daemon runs in process (``e2e.running_daemon``) with the real SMTP agent;
what is asserted is what a remote server (an aiosmtpd sink) and the log see.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.integration.e2e import (
    commit,
    offline_spool,
    running_daemon,
    sent_events,
    status_events,
)
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.support.clock import FakeClock
from tests.support.config import free_port, write_config

WINDOW = 4


async def test_refusing_destination_dies_defers_waiting_mail_and_revives_after_backoff(
    tmp_path: Path,
) -> None:
    """Refused connections kill the destination within the first window; the rest defer unsent.

    Defaults: initial window 5, cohort limit 1, constant negative feedback 1.
    Each refused connection is a negative report (5 -> 3 -> 2 -> dead after at
    most 3 reports, notes §7.3), so at most 5 connections are ever tried for 20
    queued messages; the others are deferred at once with ``relay=none``. After
    ``minimal_backoff_time`` (300 s on the fake clock) the destination revives
    and, once a server listens there, the retry delivers every message once.
    """
    clock = FakeClock()
    port = free_port()  # nothing listens there: every connection is refused
    conf = write_config(tmp_path, main=f"relayhost = [127.0.0.1]:{port}")
    rcpts = [f"u{i}@dead.test" for i in range(20)]
    with capture_logs() as logs:
        async with running_daemon(conf, clock=clock, listen=False) as d:
            ids = [d.enqueue("s@src.test", [r]) for r in rcpts]
            await d.wait_idle()
            assert sorted(d.queue_ids("deferred")) == sorted(ids)
            tried = d.engine.stats.deliveries
            assert 1 <= tried <= 5
            dead = [e for e in logs if e.get("event") == "destination dead"]
            assert len(dead) == 1 and dead[0]["transport"] == "smtp"
            unattempted = [e for e in status_events(logs, "deferred") if e.get("relay") == "none"]
            assert len(unattempted) == 20 - tried
            for qid in ids:
                (reason,) = d.spool.read_reasons("defer", qid)
                assert reason.dsn.startswith("4.")

            # Revival: a server now listens there; the dead timer fires after
            # minimal_backoff_time, and the deferred scan of that same moment
            # (queue_run_delay is also 300 s) finds every message due.
            async with smtp_sink(port=port) as sink:
                clock.advance(300)
                d.engine.wakeup()
                await d.wait_idle()
                assert any(e.get("event") == "destination revived" for e in logs)
                assert d.queue_ids("deferred") == [] and d.queue_ids("active") == []
    assert Counter(r for m in sink.messages for r in m.rcpt_tos) == Counter(rcpts)
    assert sorted(a for _q, a in sent_events(logs)) == sorted(rcpts)


async def test_small_messages_preempt_a_big_one_at_a_one_at_a_time_destination(
    tmp_path: Path,
) -> None:
    """Five 1-recipient messages queued after a 200-recipient one arrive before it finishes.

    Arithmetic: the dedicated transport ``slow`` has
    ``slow_destination_concurrency_limit = 1`` (one delivery at a time) and
    ``slow_destination_recipient_limit = 5``, so the big message is 200 / 5 =
    40 entries. Preemption needs the running job to have at least
    ``minimum_delivery_slots`` x ``delivery_slot_cost`` = 3 x 5 = 15 entries
    (40 >= 15), and each of its deliveries earns 1 / ``delivery_slot_cost``
    of a slot, so after about 5 of its 40 deliveries a 1-entry job may cut in.
    Without preemption (first come, first served) all 40 entries of the big
    message would reach the sink before any small one.
    """
    async with smtp_sink(SinkConfig(delay=0.001)) as sink:
        conf = write_config(
            tmp_path,
            main=(
                f"transport_maps = inline:{{ big.test=slow:{sink.nexthop}, "
                f"small.test=slow:{sink.nexthop} }}\n"
                "slow_destination_concurrency_limit = 1\n"
                "slow_destination_recipient_limit = 5\n"
            ),
            master="slow unix - - n - - smtp\n",
        )
        # Queue everything before the daemon starts: its first scan sees all six at once.
        spool = offline_spool(conf)
        big = commit(
            spool, "s@src.test", [f"b{i}@big.test" for i in range(200)], arrival_time=time.time()
        )
        small = [
            commit(spool, "s@src.test", [f"s{i}@small.test"], arrival_time=time.time())
            for i in range(5)
        ]
        async with running_daemon(conf, listen=False) as d:
            await d.wait_idle()
    assert sink.peak == 1
    order = [m.rcpt_tos[0].split("@")[1] for m in sink.messages]
    assert len(order) == 45 and order.count("big.test") == 40
    last_big = max(i for i, dom in enumerate(order) if dom == "big.test")
    small_at = [i for i, dom in enumerate(order) if dom == "small.test"]
    assert all(i < last_big for i in small_at), order
    assert order[0] == "big.test"  # it was first in line and started first
    assert big and len(small) == 5


@pytest.mark.parametrize(
    ("extra", "bound"),
    [
        # On demand (the default): the first burst is selected before any delivery to the
        # destination completed, so it is not "back to back" and its sessions are not kept
        # (notes §10.1, as Postfix); every later session is kept. At most 2 x window.
        ("", 2 * WINDOW),
        # smtp_connection_cache_destinations: every session to it is kept. At most the window.
        ("smtp_connection_cache_destinations = 127.0.0.1", WINDOW),
    ],
    ids=["on-demand", "always"],
)
async def test_two_hundred_messages_reuse_connections_within_the_window(
    tmp_path: Path, extra: str, bound: int
) -> None:
    """200 back-to-back messages to one destination reuse sessions: connections stay bounded."""
    async with smtp_sink() as sink:
        conf = write_config(
            tmp_path,
            main=f"relayhost = {sink.nexthop}\n"
            f"smtp_destination_concurrency_limit = {WINDOW}\n{extra}\n",
        )
        spool = offline_spool(conf)
        for i in range(200):
            commit(spool, "s@src.test", [f"r{i}@dst.test"], arrival_time=time.time())
        async with running_daemon(conf, listen=False) as d:
            await d.wait_idle()
            assert d.engine.stats.recipients_sent == 200
    assert len(sink.messages) == 200
    assert sink.peak <= WINDOW
    assert sink.connections <= bound, sink.connections
    assert sink.commands.count("RSET") >= 200 - sink.connections  # each reuse probes with RSET
