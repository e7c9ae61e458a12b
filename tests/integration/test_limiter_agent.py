"""The SMTP agent tells a refused session ("full" / "rate") from a destination failure."""

from __future__ import annotations

import asyncio
import socket

import pytest

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import SinkConfig, make_request, smtp_sink

FAST = SmtpSettings(helo_name="client.test", connect_timeout=5, helo_timeout=5, rset_timeout=5)


async def test_session_over_the_server_limit_is_full() -> None:
    """The session a 5-session-style limiter refuses with 421 is "full", with its hop status
    kept for an engine that does not look at ``throttle``; the admitted one is not throttled."""
    async with smtp_sink(SinkConfig(max_sessions=1, stall=frozenset({"MAIL"}))) as sink:
        agent = SmtpAgent(FAST)
        first = asyncio.ensure_future(agent.deliver(make_request(sink.nexthop, ["a@x.test"])))
        await sink.wait_stalled("MAIL")
        second = await agent.deliver(make_request(sink.nexthop, ["b@x.test", "c@x.test"]))
        sink.release()
        first_result = await asyncio.wait_for(first, 10)
        await agent.close()
    assert (first_result.hop, first_result.throttle) == (None, None)
    assert second.throttle == "full"
    assert second.hop is not None and second.hop.dsn == "4.7.0"
    assert {r.outcome for r in second.recipients} == {Outcome.DEFERRED}


@pytest.mark.parametrize(
    ("greeting", "throttle"),
    [
        ("421 4.7.28 Our system has detected an unusual rate of mail; rate limited", "rate"),
        ("421 4.7.0 [TSS04] Messages temporarily deferred due to unexpected volume", "rate"),
        ("421 4.3.2 Service shutting down", "full"),
        ("450 4.7.1 too many connections from your IP (rate controlled)", "full"),
        ("451 4.3.0 local error in processing", None),
        ("554 5.7.1 go away", None),
    ],
)
async def test_greeting_refusals_are_classified(greeting: str, throttle: str | None) -> None:
    """Rate-limit greetings are "rate", a plain 421 or a connection limit "full", other 4xx and
    every 5xx greeting a plain destination failure (hop status, no throttle)."""
    async with smtp_sink(SinkConfig(greeting=greeting)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.hop is not None
    assert result.throttle == throttle


async def test_refused_connection_is_full() -> None:
    """A refused TCP connection is "full" (a full server or its firewall answers so); the core
    still treats it as a failure when nothing else to the destination is working."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = SmtpAgent(FAST)
    result = await agent.deliver(make_request(f"[127.0.0.1]:{port}", ["a@x.test"]))
    await agent.close()
    assert result.hop is not None and result.hop.dsn == "4.4.1"
    assert result.throttle == "full"


async def test_recipient_level_421_is_not_a_throttle() -> None:
    """A throttling text at RCPT is a recipient deferral (positive feedback, no hop status):
    only a refused session is a throttle."""
    cfg = SinkConfig(rcpt_replies={"a@x.test": (450, "4.2.1 receiving mail at a rate, try later")})
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.hop, result.throttle) == (None, None)


async def test_sink_admits_simultaneous_connections_in_arrival_order() -> None:
    """Six connections arriving together at a 5-session sink: five are greeted with 220 and
    only one gets 421 (an anvil-style limiter; counting later arrivals refused all six, which
    was half of the daemon's "35 %" for 1/sqrt_concurrency, docs/limiter.md)."""
    async with smtp_sink(SinkConfig(max_sessions=5)) as sink:
        conns = await asyncio.gather(
            *(asyncio.open_connection(sink.host, sink.port) for _ in range(6))
        )
        greetings = await asyncio.wait_for(
            asyncio.gather(*(reader.readline() for reader, _ in conns)), 10
        )
        for _, writer in conns:
            writer.close()
    codes = sorted(line[:3] for line in greetings)
    assert codes == [b"220"] * 5 + [b"421"]
    assert sink.refused == 1
