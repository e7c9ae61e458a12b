"""sender_dependent_relayhost_maps end to end: the sender of a message picks its relayhost."""

from __future__ import annotations

from pathlib import Path

from tests.integration.e2e import running_daemon
from tests.integration.sinks import smtp_sink
from tests.support.config import write_config


async def test_two_senders_are_relayed_to_two_sinks(tmp_path: Path) -> None:
    """By full address, by @domain, and relayhost for every other sender (Postfix's order)."""
    async with smtp_sink() as by_address, smtp_sink() as by_domain, smtp_sink() as default:
        conf = write_config(
            tmp_path,
            main=(
                f"relayhost = {default.nexthop}\n"
                "sender_dependent_relayhost_maps = inline:{ "
                f"alice@src.test={by_address.nexthop}, @other.test={by_domain.nexthop} }}\n"
            ),
        )
        async with running_daemon(conf) as d:
            await d.submit("alice@src.test", ["r1@dst.test"])
            await d.submit("bob@other.test", ["r2@dst.test"])
            await d.submit("carol@src.test", ["r3@dst.test"])
            await d.wait_idle()
    assert [(m.mail_from, m.rcpt_tos) for m in by_address.messages] == [
        ("alice@src.test", ["r1@dst.test"])
    ]
    assert [(m.mail_from, m.rcpt_tos) for m in by_domain.messages] == [
        ("bob@other.test", ["r2@dst.test"])
    ]
    assert [(m.mail_from, m.rcpt_tos) for m in default.messages] == [
        ("carol@src.test", ["r3@dst.test"])
    ]
