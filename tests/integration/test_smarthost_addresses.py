"""Addresses go out exactly as stored, or fail that message/recipient: never a destination."""

from __future__ import annotations

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import make_request, smtp_sink

FAST = SmtpSettings(helo_name="client.test", connect_timeout=5, helo_timeout=5)
INVALID_UTF8 = b'"a\\\xffb"@dst.test'.decode("utf-8", "surrogateescape")  # as the spool stores it


async def test_bad_senders_then_good_ones_all_delivered() -> None:
    """Five senders with an escaped ESC bounce 5.1.7 without a hop status; five good ones go."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        bad = [
            await agent.deliver(
                make_request(sink.nexthop, [f"b{i}@x.test"], sender='"a\x1bb"@e.test')
            )
            for i in range(5)
        ]
        good = [await agent.deliver(make_request(sink.nexthop, [f"g{i}@x.test"])) for i in range(5)]
        await agent.close()
    assert all(r.hop is None for r in bad + good)
    assert {(r.recipients[0].outcome, r.recipients[0].dsn) for r in bad} == {
        (Outcome.BOUNCED, "5.1.7")
    }
    assert "control character" in bad[0].recipients[0].reply
    assert [r.recipients[0].outcome for r in good] == [Outcome.SENT] * 5
    assert sink.connections <= 5 and len(sink.messages) == 5  # bad mail never connected


async def test_bad_recipient_fails_alone() -> None:
    """A recipient that cannot be sent as is bounces 5.1.3; the others of the message go."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(
            make_request(sink.nexthop, ["ok@x.test", '"c\x07d"@x.test', INVALID_UTF8])
        )
        await agent.close()
    outcomes = [(r.outcome, r.dsn) for r in result.recipients]
    assert outcomes == [
        (Outcome.SENT, "2.0.0"),
        (Outcome.BOUNCED, "5.1.3"),
        (Outcome.BOUNCED, "5.1.3"),
    ]
    assert "not valid UTF-8" in result.recipients[2].reply
    assert sink.messages[0].rcpt_tos == ["ok@x.test"]


async def test_eight_bit_address_needs_smtputf8_and_is_never_altered() -> None:
    """A UTF-8 address goes out byte for byte with SMTPUTF8 and bounces without it (no '?')."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        with_utf8 = await agent.deliver(make_request(sink.nexthop, ["jörg@x.test"], smtputf8=True))
        without = await agent.deliver(make_request(sink.nexthop, ["jörg@x.test"]))
        await agent.close()
    assert with_utf8.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].rcpt_tos == ["jörg@x.test"]
    assert (without.recipients[0].outcome, without.recipients[0].dsn) == (Outcome.BOUNCED, "5.1.3")
    assert len(sink.messages) == 1


async def test_quoted_space_address_relayed_unchanged() -> None:
    """'"sp ace"@d' is sent exactly as stored, sender and recipient."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(FAST)
        result = await agent.deliver(
            make_request(sink.nexthop, ['"sp ace"@x.test'], sender='"s p"@src.test')
        )
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert (sink.messages[0].mail_from, sink.messages[0].rcpt_tos) == (
        '"s p"@src.test',
        ['"sp ace"@x.test'],
    )
