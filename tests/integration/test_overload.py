"""Overload without collapse: past capacity clients get 421 4.3.2, nothing accepted is lost.

The relay's capacity is made small and exact: deliveries stall at the sink
(so every accepted message stays in the queue manager) and
``in_flow_backlog_limit`` is 5. Three times that many clients then send one
message each, a new session per message (smtp-source's shape), in waves of 5
sessions at once (sessions that all pass MAIL before any of them commits are
all accepted: the backlog counts committed mail).
What is asserted is behaviour, never timing: every client gets either
``250 ... queued as ID`` or ``421 4.3.2 Service currently unavailable`` (at
the greeting or at MAIL) -- no timeout, no other reply; the control socket
answers during the overload; and once the sink is released every accepted
message arrives exactly once and the spool empties.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from qmgrd.daemon.control import control_socket_path
from qmgrd.ops.client import call
from tests.integration.e2e import running_daemon
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.support.config import write_config
from tests.support.onemessage import one_message
from tests.support.waits import TIMEOUT

LIMIT = 5
OFFERED = 3 * LIMIT


async def test_overload_gets_421_and_loses_nothing(tmp_path: Path) -> None:
    """3x the backlog limit at once: 421 4.3.2 or queued, control answers, all delivered once."""
    async with smtp_sink(SinkConfig(stall=frozenset({"MAIL"}))) as sink:
        conf = write_config(
            tmp_path,
            f"relayhost = {sink.nexthop}\nin_flow_backlog_limit = {LIMIT}\nin_flow_delay = 1s",
        )
        async with running_daemon(conf) as d:
            # A first message makes sure deliveries are stalled before the flood.
            first = await one_message(d.port, 0)
            assert first[0] == "accepted"
            await sink.wait_stalled("MAIL")
            outcomes: list[tuple[str, str]] = []
            for wave in range(1, OFFERED, LIMIT):  # waves of LIMIT sessions at once
                batch = range(wave, min(wave + LIMIT, OFFERED))
                outcomes += await asyncio.gather(*(one_message(d.port, n) for n in batch))
            accepted = [first[1]] + [v for kind, v in outcomes if kind == "accepted"]
            refused = [v for kind, v in outcomes if kind == "refused"]
            assert refused, "nothing was refused past capacity"
            assert all(r == "421 4.3.2 Service currently unavailable" for r in refused)
            assert len(accepted) + len(refused) == OFFERED
            assert len(accepted) >= LIMIT  # capacity was used before refusing
            sock = control_socket_path(d.spool.root)
            reply = await asyncio.wait_for(asyncio.to_thread(call, sock, {"op": "status"}), TIMEOUT)
            assert reply["ok"] is True
            sink.release()
            await sink.wait_messages(len(accepted))
            await d.wait_idle()
            for queue in ("incoming", "active", "deferred", "corrupt", "hold"):
                assert d.queue_ids(queue) == [], queue
        subjects = sorted(m.content.split(b"Subject: ")[1].split(b"\r\n")[0] for m in sink.messages)
        assert len(subjects) == len(set(subjects)) == len(accepted)  # each exactly once
