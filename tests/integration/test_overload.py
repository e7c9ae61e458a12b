"""Overload without collapse: past capacity clients get 421 4.3.2, nothing accepted is lost;
a burst past a listener's session cap is answered at once and never passes the cap.

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
import os
from pathlib import Path

from structlog.testing import capture_logs

from qmgrd.daemon.control import control_socket_path
from qmgrd.daemon.intakeflow import FlowSettings, WorkerRegulator
from qmgrd.listener.inflow import OVERLOAD_REPLY
from qmgrd.ops.client import call
from tests.integration.e2e import running_daemon
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.support.config import write_config
from tests.support.listener import Chat, listening, loopback_settings
from tests.support.onemessage import one_message
from tests.support.waits import TIMEOUT, wait_until

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


CAP = 10
BURST = 60


class _MostLive:
    """An intake observer that keeps the most sessions live at once (``IntakeObserver``)."""

    def __init__(self) -> None:
        self.live = self.most = 0

    def connected(self) -> None:
        """Not counted."""

    def rejected(self, reason: str) -> None:
        """Not counted."""

    def session_started(self) -> None:
        self.live += 1
        self.most = max(self.most, self.live)

    def session_ended(self) -> None:
        self.live -= 1

    def replied(self, text: str) -> None:
        """Not counted."""

    def message_accepted(self, recipients: int) -> None:
        """Not counted."""

    def auth_failed(self, mechanism: str) -> None:
        """Not counted."""


async def _first_line(port: int) -> tuple[Chat, str]:
    return await Chat.open("127.0.0.1", port)


async def test_a_burst_past_the_session_cap_is_answered_at_once_and_never_passes_it(
    tmp_path: Path,
) -> None:
    """BURST clients connect at once to a listener whose session cap is CAP (a listener
    worker's regulator, its cap at the ceiling): every client is answered at once, the greeting
    or ``421 4.3.2`` (none is left waiting in the listen queue); exactly CAP sessions start,
    never more live at once, although the listener accepts the burst in batches (an admitted
    connection counts until its session begins); the refusals are logged as a count, not a
    line each; and once the sessions end, the listener (which stopped watching its socket
    for a moment after refusing) serves new clients again."""
    r, w = os.pipe()
    regulator = WorkerRegulator(r, FlowSettings(lag_limit=0.05, session_limit=CAP))
    watch = _MostLive()
    regulator.sessions = lambda: watch.live
    try:
        async with listening(tmp_path, loopback_settings(session_limit=1000)) as srv:
            srv.handle.ctx.inflow = regulator.gate
            srv.handle.ctx.observer = watch
            with capture_logs() as logs:
                opened = await asyncio.wait_for(
                    asyncio.gather(*(_first_line(srv.port) for _ in range(BURST))), TIMEOUT
                )
            replies = [reply for _, reply in opened]
            served = [chat for chat, reply in opened if reply.startswith("220 ")]
            assert len(served) == CAP and watch.most == CAP
            assert replies.count(OVERLOAD_REPLY) == BURST - CAP
            assert regulator.gate.refused == BURST - CAP and regulator.gate.pending == 0
            lines = [e for e in logs if e["event"] == "over capacity: connections refused"]
            assert 1 <= len(lines) <= (BURST - CAP) // 10
            for chat, _ in opened:
                await chat.close()
            await wait_until(lambda: watch.live == 0, "the burst's sessions to end")
            again, greeting = await _first_line(srv.port)
            assert greeting.startswith("220 ")
            assert (await again.cmd("QUIT")).startswith("221")
            await again.close()
    finally:
        regulator.stop()
        os.close(r)
        os.close(w)
