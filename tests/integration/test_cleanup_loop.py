"""A route back to the daemon itself ends after hopcount_limit hops with one DSN.

The SMTP listener is being rewritten elsewhere and does not run cleanup yet,
so the daemon's intake here is a stand-in: an aiosmtpd server on 127.0.0.1
port 0 that does exactly what the listener must do at the end of DATA (run
`HeaderProcessor` over the content, `decide()`, commit, notify the engine).
Everything else (engine, SMTP client, bounces) is the real daemon. The stand-in
greets as ``gateway.test`` while ``myhostname`` is ``mx.test``, so the SMTP
client's loop test does not stop the loop at once (as with a gateway that
sends mail back): only the hop count does.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiosmtpd.smtp import SMTP as AioSMTP

from qmgrd.cleanup import CleanupSettings, HeaderProcessor, MessageInfo, decide
from qmgrd.spool import Envelope, RecipientSpec
from tests.integration.e2e import InProcessDaemon, start_daemon, write_config


@dataclass(slots=True)
class Intake:
    """The stand-in listener's state: the daemon it feeds and what it saw."""

    settings: CleanupSettings
    daemon: InProcessDaemon | None = None
    seen: list[tuple[str, bytes]] = field(default_factory=list)  # (sender, content) per DATA
    replies: list[str] = field(default_factory=list)

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        assert self.daemon is not None
        content = envelope.original_content or b""
        sender = envelope.mail_from or ""
        if sender == "<>":
            sender = ""
        self.seen.append((sender, content))
        qid = self.daemon.spool.new_queue_id()
        processor = HeaderProcessor(
            self.settings,
            MessageInfo(
                queue_id=qid,
                sender=sender,
                recipients=tuple(envelope.rcpt_tos),
                now=time.time(),
                local=False,
                helo=session.host_name,
                client_addr=session.peer[0],
            ),
        )
        out = processor.feed(content) + processor.finish()
        decision = decide(processor.outcome)
        if decision.reply is not None:
            self.replies.append(decision.reply)
            return decision.reply
        env = Envelope(
            sender=sender,
            recipients=tuple(RecipientSpec(r) for r in envelope.rcpt_tos),
            arrival_time=time.time(),
        )
        stored = self.daemon.spool.commit(env, out)
        self.daemon.engine.notify_incoming(stored)
        return f"250 2.0.0 Ok: queued as {stored}"


async def test_route_back_to_itself_bounces_after_hopcount_limit(tmp_path: Path) -> None:
    """50 relays (not thousands), then 554 5.4.0; the sender gets exactly one DSN."""
    loop = asyncio.get_running_loop()
    intake_state: list[Intake] = []

    def factory() -> AioSMTP:
        return AioSMTP(intake_state[0], hostname="gateway.test")

    server = await loop.create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    conf = write_config(tmp_path, main=f"relayhost = [127.0.0.1]:{port}\n")
    from qmgrd.config import load_config

    intake = Intake(CleanupSettings.from_config(load_config(conf, hostname="mx.test")))
    intake_state.append(intake)
    daemon = await start_daemon(conf, listen=False)
    intake.daemon = daemon
    try:
        daemon.enqueue("s@src.test", ["r@dst.test"], b"Subject: loop\r\n\r\nbody\r\n")
        await daemon.wait_idle(120)  # every hop is committed before its delivery completes
        assert daemon.queue_ids("incoming") == [] and daemon.queue_ids("deferred") == []
    finally:
        await daemon.stop()
        server.close()
        await server.wait_closed()
    original = [c for s, c in intake.seen if s == "s@src.test"]
    notices = [c for s, c in intake.seen if s == ""]
    # 50 relays accepted (0..49 Received: headers), the 51st sees 50 and is refused
    assert len(original) == 51, len(original)
    assert "554 5.4.0 Error: too many hops" in intake.replies
    dsn_ids = {m.group(1) for c in notices if (m := re.search(rb"Message-ID: (\S+)", c, re.I))}
    assert len(dsn_ids) == 1  # one notice (it then loops too, and dies at the limit unreturned)
    assert all(b"5.4.0" in c for c in notices)
