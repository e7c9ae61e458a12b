"""The SMTP agent against in-process aiosmtpd sinks on 127.0.0.1: outcomes and hop status."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator

import pytest

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.mx import Destination, DnsFailure, Endpoint, MxResolver
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import MESSAGE, SinkConfig, make_request, smtp_sink

FAST = SmtpSettings(helo_name="client.test", connect_timeout=5, helo_timeout=5, rset_timeout=5)


async def test_delivers_message_to_sink() -> None:
    """A plain delivery sends every recipient with the server's reply, relay and dsn."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["b@example.com", "c@example.com"]))
        await agent.close()
    assert [r.outcome for r in result.recipients] == [Outcome.SENT, Outcome.SENT]
    assert result.hop is None
    first = result.recipients[0]
    assert first.dsn == "2.0.0"
    assert first.reply.startswith("250 2.0.0 Ok: queued as")
    assert first.relay == f"127.0.0.1[127.0.0.1]:{sink.port}"
    assert len(sink.messages) == 1
    msg = sink.messages[0]
    assert msg.mail_from == "a@example.org"
    assert msg.rcpt_tos == ["b@example.com", "c@example.com"]
    assert msg.content == MESSAGE
    assert f"SIZE={len(MESSAGE)}" in msg.mail_options


async def test_large_message_is_streamed_intact() -> None:
    """A multi-megabyte message with dot lines arrives byte-identical (chunked streaming)."""
    line = b".leading dot and some text to make the line longer than usual\r\n"
    content = b"Subject: big\r\n\r\n" + line * 60000  # ~3.8 MB, many chunks
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["b@x.test"], content=content))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].content == content


async def test_per_recipient_replies() -> None:
    """RCPT 4xx defers and 5xx bounces only that recipient, with the server's enhanced code."""
    cfg = SinkConfig(
        rcpt_replies={
            "soft@x.test": (450, "4.2.1 mailbox busy"),
            "hard@x.test": (550, "5.1.1 no such user"),
        }
    )
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(
            make_request(sink.nexthop, ["ok@x.test", "soft@x.test", "hard@x.test"])
        )
        await agent.close()
    ok, soft, hard = result.recipients
    assert ok.outcome is Outcome.SENT
    assert (soft.outcome, soft.dsn) == (Outcome.DEFERRED, "4.2.1")
    assert (hard.outcome, hard.dsn) == (Outcome.BOUNCED, "5.1.1")
    assert "550 5.1.1 no such user" in hard.reply
    assert "RCPT TO" in hard.reply
    assert result.hop is None  # recipient-level replies are positive feedback
    assert sink.messages[0].rcpt_tos == ["ok@x.test"]


async def test_all_recipients_rejected_no_data() -> None:
    """When every RCPT is refused no DATA is sent and there is no hop status."""
    cfg = SinkConfig(rcpt_replies={"a@x.test": (550, "5.1.1 unknown")})
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.BOUNCED
    assert "DATA" not in sink.commands
    assert result.hop is None


async def test_soft_bounce_defers_hard_errors() -> None:
    """With soft_bounce a 5xx RCPT reply defers the recipient with a 4.x.x code."""
    cfg = SinkConfig(rcpt_replies={"a@x.test": (550, "5.1.1 unknown")})
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(SmtpSettings(helo_name="c.test", soft_bounce=True))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.1.1")


async def test_mail_from_rejected_is_message_level() -> None:
    """A 5xx to MAIL FROM bounces every recipient without a hop status."""
    cfg = SinkConfig(mail_reply=(553, "5.7.1 sender rejected"))
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test", "b@x.test"]))
        await agent.close()
    assert {r.outcome for r in result.recipients} == {Outcome.BOUNCED}
    assert {r.dsn for r in result.recipients} == {"5.7.1"}
    assert result.hop is None


async def test_data_rejected_defers_without_hop() -> None:
    """A 4xx after the end of DATA defers the accepted recipients; it is not a hop failure."""
    cfg = SinkConfig(data_reply=(451, "4.3.0 try later"))
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.3.0")
    assert result.hop is None


async def test_connection_refused_is_hop_failure() -> None:
    """A refused connection defers every recipient with 4.4.1 and sets a hop status."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = SmtpAgent(FAST)
    result = await agent.deliver(make_request(f"[127.0.0.1]:{port}", ["a@x.test"]))
    await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.4.1")
    assert "Connection refused" in rcpt.reply
    assert result.hop is not None and result.hop.dsn == "4.4.1"


async def test_max_sessions_421_is_hop_failure() -> None:
    """A server refusing extra concurrent sessions with 421 gives those deliveries a hop status."""
    async with smtp_sink(SinkConfig(max_sessions=1, stall=frozenset({"MAIL"}))) as sink:
        agent = SmtpAgent(FAST)
        first = asyncio.ensure_future(agent.deliver(make_request(sink.nexthop, ["a@x.test"])))
        await sink.wait_stalled("MAIL")  # the first session holds the slot
        assert sink.active >= 1 and "EHLO" in sink.commands
        second = await agent.deliver(make_request(sink.nexthop, ["b@x.test"]))
        sink.release()
        first_result = await asyncio.wait_for(first, 10)
        await agent.close()
    assert first_result.recipients[0].outcome is Outcome.SENT
    assert first_result.hop is None
    assert second.recipients[0].outcome is Outcome.DEFERRED
    assert second.hop is not None and second.hop.dsn == "4.7.0"
    assert "421" in second.recipients[0].reply
    assert sink.refused == 1


async def test_greeting_421_and_5xx_are_hop_failures() -> None:
    """A 421 greeting defers with a hop status; a 5xx greeting is softened (skip_5xx_greeting)."""
    for greeting, dsn in (("421 4.3.2 shutting down", "4.3.2"), ("554 5.7.1 go away", "4.7.1")):
        async with smtp_sink(SinkConfig(greeting=greeting)) as sink:
            agent = SmtpAgent(FAST)
            result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
            await agent.close()
        assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, dsn)
        assert result.hop is not None
        assert "refused to talk to me" in result.recipients[0].reply


async def test_drop_in_data_is_hop_failure() -> None:
    """A connection dropped during DATA defers the recipients with 4.4.2 and a hop status."""
    async with smtp_sink(SinkConfig(drop_in_data=True)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test", "b@x.test"]))
        await agent.close()
    assert {r.outcome for r in result.recipients} == {Outcome.DEFERRED}
    assert {r.dsn for r in result.recipients} == {"4.4.2"}
    assert "lost connection" in result.recipients[0].reply
    assert result.hop is not None and result.hop.dsn == "4.4.2"
    assert sink.dropped == 1 and not sink.messages


async def test_stalled_server_times_out() -> None:
    """A server that stops answering RCPT times out: deferred 4.4.2 with a hop status."""
    settings = SmtpSettings(helo_name="c.test", rcpt_timeout=0.2)
    async with smtp_sink(SinkConfig(stall=frozenset({"RCPT"}))) as sink:
        agent = SmtpAgent(settings)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.4.2")
    assert "timed out while sending RCPT TO" in rcpt.reply
    assert result.hop is not None


async def test_ehlo_refused_falls_back_to_helo() -> None:
    """A server refusing EHLO is spoken to with HELO and the delivery succeeds without SIZE."""
    async with smtp_sink(SinkConfig(ehlo=False)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.commands[:2] == ["EHLO", "HELO"]
    assert sink.messages[0].mail_options == []


async def test_smtputf8_required_but_not_offered_bounces() -> None:
    """A message needing SMTPUTF8 bounces with 5.6.7 when the server does not offer it."""
    async with smtp_sink(SinkConfig(smtputf8=False)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"], smtputf8=True))
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.BOUNCED, "5.6.7")
    assert result.hop is None and not sink.messages


async def test_smtputf8_and_8bitmime_parameters_sent() -> None:
    """SMTPUTF8 and BODY=8BITMIME are sent when the message needs them and the server has them."""
    content = "Subject: caf\u00e9\r\n\r\nna\u00efve\r\n".encode()
    async with smtp_sink(SinkConfig(smtputf8=True)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(
            make_request(
                sink.nexthop,
                ["j\u00f6rg@x.test"],
                content=content,
                smtputf8=True,
                body_8bitmime=True,
            )
        )
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    msg = sink.messages[0]
    assert "SMTPUTF8" in msg.mail_options and "BODY=8BITMIME" in msg.mail_options
    assert msg.rcpt_tos == ["j\u00f6rg@x.test"]
    assert msg.content == content


async def test_size_limit_exceeded_bounces() -> None:
    """A message larger than the server's advertised SIZE bounces with 5.3.4 before MAIL."""
    async with smtp_sink(SinkConfig(size_limit=10)) as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.BOUNCED, "5.3.4")
    assert not sink.messages


async def test_bad_nexthop_defers_without_exception() -> None:
    """An unparsable nexthop defers with 4.3.5 instead of raising."""
    agent = SmtpAgent(FAST)
    result = await agent.deliver(make_request("[unbalanced:25", ["a@x.test"]))
    await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.3.5")


@pytest.mark.parametrize("count", [1, 3])
async def test_every_recipient_gets_a_result(count: int) -> None:
    """deliver() returns exactly one result per recipient, in request order."""
    addrs = [f"r{i}@x.test" for i in range(count)]
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(make_request(sink.nexthop, addrs))
        await agent.close()
    assert [r.recipient.address for r in result.recipients] == addrs


class _BrokenContent:
    """A content source whose queue file read fails after the first chunk."""

    size = 100
    data = None  # read from the queue file

    async def chunks(self, chunk_size: int = 65536) -> AsyncIterator[bytes]:
        yield b"Subject: x\r\n\r\n"
        raise OSError("read error on queue file")


async def test_content_read_error_defers_without_hop() -> None:
    """A queue-file read error during DATA defers with 4.3.0, no hop, and nothing delivered."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        request = dataclasses.replace(
            make_request(sink.nexthop, ["a@x.test"]), content=_BrokenContent()
        )
        result = await agent.deliver(request)
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.3.0")
    assert "read error" in rcpt.reply
    assert result.hop is None
    assert not sink.messages


async def test_unexpected_exception_becomes_deferral() -> None:
    """An unexpected exception in the agent is a per-message 4.3.0 deferral, not a hop failure."""

    class ExplodingResolver(MxResolver):
        async def lookup(self, dest: Destination) -> list[Endpoint] | DnsFailure:
            raise RuntimeError("boom")

    agent = SmtpAgent(FAST, resolver=ExplodingResolver())
    result = await agent.deliver(make_request("example.test", ["a@x.test", "b@x.test"]))
    await agent.close()
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.DEFERRED, "4.3.0")}
    assert result.hop is None


async def test_cancelled_delivery_closes_its_connection() -> None:
    """Cancelling a delivery in the middle of a transaction closes its connection."""
    async with smtp_sink(SinkConfig(stall=frozenset({"RCPT"}))) as sink:
        agent = SmtpAgent(FAST)
        task = asyncio.ensure_future(agent.deliver(make_request(sink.nexthop, ["a@x.test"])))
        await sink.wait_stalled("RCPT")
        assert sink.active == 1 and "EHLO" in sink.commands
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await sink.wait_for(lambda: sink.active == 0, "the connection to close")
        await agent.close()
        assert sink.active == 0
