"""Relaying end to end: SMTP in, the engine with real agents, aiosmtpd sinks on 127.0.0.1 out.

Each test runs a whole daemon in process (``e2e.running_daemon``): the
listener, the engine with the scheduler and the spool, and the real SMTP agent,
routed to sinks with ``relayhost`` or ``transport_maps = inline:{...}``.
"""

from __future__ import annotations

import email
import email.message
import random
from collections import Counter
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tests.integration.e2e import (
    message_bytes,
    running_daemon,
    sent_events,
    status_events,
)
from tests.integration.sinks import SinkConfig, SinkServer, smtp_sink
from tests.support.clock import FakeClock
from tests.support.config import write_config


def _transport_map(routes: dict[str, SinkServer], transport: str = "smtp") -> str:
    pairs = ", ".join(f"{domain}={transport}:{sink.nexthop}" for domain, sink in routes.items())
    return f"transport_maps = inline:{{ {pairs} }}"


def _received(*sinks: SinkServer) -> Counter[str]:
    return Counter(rcpt for sink in sinks for m in sink.messages for rcpt in m.rcpt_tos)


@pytest.mark.slow
async def test_thousand_messages_each_recipient_arrives_exactly_once(tmp_path: Path) -> None:
    """1,000 messages of 1-20 recipients over 3 sinks: every recipient once, spool empty, logged."""
    rng = random.Random(1)
    async with smtp_sink() as s0, smtp_sink() as s1, smtp_sink() as s2:
        routes = {"d0.test": s0, "d1.test": s1, "d2.test": s2}
        conf = write_config(tmp_path, main=_transport_map(routes))
        messages: list[tuple[str, list[str]]] = []
        for i in range(1000):
            n = rng.randint(1, 20)
            messages.append(
                (f"s{i}@src.test", [f"u{i}x{j}@d{rng.randrange(3)}.test" for j in range(n)])
            )
        expected = Counter(r for _s, rcpts in messages for r in rcpts)
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                ids = await d.submit_many(messages, clients=8)
                await d.wait_idle(60)
                for queue in ("incoming", "active", "deferred", "corrupt", "hold"):
                    assert d.queue_ids(queue) == [], queue
        assert _received(s0, s1, s2) == expected
        # Each sink got only its own domain.
        for domain, sink in routes.items():
            assert all(r.endswith("@" + domain) for m in sink.messages for r in m.rcpt_tos)
        sent = sent_events(logs)
        assert len(sent) == sum(expected.values())
        assert Counter(a for _q, a in sent) == expected
        by_id = dict(zip(ids, messages, strict=True))
        assert all(a in by_id[q][1] for q, a in sent)


async def test_450_recipients_are_deferred_and_sent_on_the_next_attempt(tmp_path: Path) -> None:
    """A 450 defers only its recipient (deferred/ with backoff mtime); the retry sends only it."""
    clock = FakeClock()
    sink_cfg = SinkConfig(rcpt_replies={"later@d.test": (450, "4.2.0 mailbox busy")})
    async with smtp_sink(sink_cfg) as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}")
        with capture_logs() as logs:
            async with running_daemon(conf, clock=clock) as d:
                qid = await d.submit("s@src.test", ["now@d.test", "later@d.test", "also@e.test"])
                await d.wait_idle()
                assert d.queue_ids("deferred") == [qid]
                mtime = d.spool.path("deferred", qid).stat().st_mtime
                assert mtime == pytest.approx(clock.now() + 300, abs=1)  # minimal_backoff_time
                reasons = d.spool.read_reasons("defer", qid)
                assert [(r.address, r.dsn) for r in reasons] == [("later@d.test", "4.2.0")]
                assert "450 4.2.0 mailbox busy" in reasons[0].reason
                assert _received(sink) == Counter(["now@d.test", "also@e.test"])

                sink.config.rcpt_replies.clear()
                clock.advance(301)
                d.engine.request_deferred_scan()
                await d.wait_idle()
                assert d.queue_ids("deferred") == [] and d.queue_ids("active") == []
        assert _received(sink) == Counter(["now@d.test", "also@e.test", "later@d.test"])
        assert sorted(a for _q, a in sent_events(logs)) == [
            "also@e.test",
            "later@d.test",
            "now@d.test",
        ]
        deferred = [e for e in status_events(logs, "deferred") if "to" in e]
        assert [e["to"] for e in deferred] == ["<later@d.test>"]


async def test_550_recipients_return_one_dsn_naming_each_with_the_remote_reply(
    tmp_path: Path,
) -> None:
    """Two 550 recipients: the sender gets one multipart/report DSN naming both with the reply."""
    replies = {
        "bad1@d.test": (550, "5.1.1 <bad1@d.test>: no such user"),
        "bad2@d.test": (550, "5.7.1 <bad2@d.test>: rejected by policy"),
    }
    async with smtp_sink(SinkConfig(rcpt_replies=replies)) as remote, smtp_sink() as home:
        routes = {"d.test": remote, "src.test": home}
        conf = write_config(tmp_path, main=_transport_map(routes))
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                await d.submit(
                    "sender@src.test",
                    ["bad1@d.test", "good@d.test", "bad2@d.test"],
                    message_bytes("original"),
                )
                await d.wait_idle()
                for queue in ("incoming", "active", "deferred", "bounce"):
                    assert d.queue_ids(queue) == [], queue
        assert _received(remote) == Counter(["good@d.test"])
        assert len(home.messages) == 1
        dsn = home.messages[0]
        assert dsn.mail_from in ("", "<>")  # aiosmtpd keeps the null sender as "<>"
        assert dsn.rcpt_tos == ["sender@src.test"]
        parsed = email.message_from_bytes(dsn.content)
        assert parsed.get_content_type() == "multipart/report"
        assert parsed.get_param("report-type") == "delivery-status"
        parts = [p for p in parsed.walk() if p.get_content_type() == "message/delivery-status"]
        assert len(parts) == 1
        status_blocks = parts[0].get_payload()
        assert isinstance(status_blocks, list)
        per_rcpt = [b for b in status_blocks[1:] if isinstance(b, email.message.Message)]
        finals = sorted(str(b["Final-Recipient"]) for b in per_rcpt)
        assert finals == ["rfc822; bad1@d.test", "rfc822; bad2@d.test"]
        # Header values may be folded: compare with whitespace runs collapsed.
        diags = {
            str(b["Final-Recipient"]): " ".join(str(b["Diagnostic-Code"]).split()) for b in per_rcpt
        }
        assert "550 5.1.1 <bad1@d.test>: no such user" in diags["rfc822; bad1@d.test"]
        assert "550 5.7.1 <bad2@d.test>: rejected by policy" in diags["rfc822; bad2@d.test"]
        assert {str(b["Action"]) for b in per_rcpt} == {"failed"}
        bounced = status_events(logs, "bounced")
        assert sorted(e["to"] for e in bounced) == ["<bad1@d.test>", "<bad2@d.test>"]
