"""smtp_generic_maps and smtp_header_checks on the way out, against a real SMTP sink."""

from __future__ import annotations

from pathlib import Path

import pytest
from structlog.testing import capture_logs

from qmgrd.config import load_config
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.errors import ConfigError
from tests.integration.e2e import running_daemon, wait_for_messages, write_config
from tests.integration.sinks import smtp_sink

GENERIC = "inline:{ root@host.localdomain=admin@example.com, @old.example=@new.example }"
# $$1: main.cf expands $name, so a group reference is written $$1 there
CHECKS = (
    "regexp:{ {/^X-Internal:/ IGNORE}, {/^X-Old: (.*)/ REPLACE X-New: $$1},"
    " {/^Subject:/ PREPEND X-Scanned: yes}, {/^X-Watch:/ WARN seen} }"
)
CONTENT = (
    b"From: Root <root@host.localdomain>\r\n"
    b"To: root@host.localdomain, bob@old.example\r\n"
    b"Subject: about root@host.localdomain\r\n"
    b"X-Internal: secret\r\n"
    b"X-Old: value\r\n"
    b"X-Watch: 1\r\n"
    b"\r\n"
    b"Mail root@host.localdomain in the body.\r\n"
    b"From: root@host.localdomain\r\n"
)


async def test_generic_maps_and_header_checks_rewrite_only_what_they_should(
    tmp_path: Path,
) -> None:
    """Envelope and address headers are rewritten; Subject, body and other headers are not."""
    async with smtp_sink() as sink:
        conf = write_config(
            tmp_path,
            main=f"relayhost = {sink.nexthop}\nsmtp_generic_maps = {GENERIC}\n"
            f"smtp_header_checks = {CHECKS}\n",
        )
        async with running_daemon(conf, listen=False) as d:
            d.enqueue(
                "root@host.localdomain", ["root@host.localdomain", "x@other.example"], CONTENT
            )
            await wait_for_messages(sink, 1)
            await d.wait_idle()
    msg = sink.messages[0]
    assert msg.mail_from == "admin@example.com"
    assert sorted(msg.rcpt_tos) == ["admin@example.com", "x@other.example"]
    head, _, body = msg.content.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert b"From: Root <admin@example.com>" in lines
    assert b"To: admin@example.com, bob@new.example" in lines
    assert b"Subject: about root@host.localdomain" in lines  # not an address header
    assert (
        lines.index(b"X-Scanned: yes") == lines.index(b"Subject: about root@host.localdomain") - 1
    )
    assert not any(line.startswith(b"X-Internal") for line in lines)
    assert b"X-New: value" in lines and b"X-Watch: 1" in lines
    assert body == b"Mail root@host.localdomain in the body.\r\nFrom: root@host.localdomain\r\n"


async def test_without_outbound_parameters_content_is_sent_as_queued(tmp_path: Path) -> None:
    """No smtp_generic_maps / smtp_header_checks: the bytes arrive exactly as queued."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        async with running_daemon(conf, listen=False) as d:
            d.enqueue("root@host.localdomain", ["r@dst.example"], CONTENT)
            await wait_for_messages(sink, 1)
    assert sink.messages[0].content == CONTENT
    assert sink.messages[0].mail_from == "root@host.localdomain"


@pytest.mark.parametrize("action", ["HOLD", "REJECT no", "DISCARD", "REDIRECT a@b.example"])
def test_smtp_header_checks_refuses_actions_it_cannot_take(tmp_path: Path, action: str) -> None:
    """Actions that need the message not yet accepted stop the start, naming the parameter."""
    conf = write_config(tmp_path, main=f"smtp_header_checks = regexp:{{ {{/^X:/ {action}}} }}\n")
    cfg = load_config(conf, hostname="mx.test")
    with pytest.raises(ConfigError, match="smtp_header_checks"):
        SmtpSettings.from_transport(cfg.transport("smtp"))


async def test_next_hop_greeting_with_my_hostname_loops_back(tmp_path: Path) -> None:
    """A server that greets with our myhostname is ourselves: 5.4.6 loops back, nothing sent."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\nmyhostname = sink.test\n")
        with capture_logs() as logs:
            async with running_daemon(conf, listen=False) as d:
                d.enqueue("s@src.example", ["r@dst.example"], CONTENT)
                await d.wait_idle()
    assert sink.messages == []
    bounced = [e for e in logs if e.get("status") == "bounced" and e.get("to") == "<r@dst.example>"]
    assert bounced and bounced[0]["dsn"] == "5.4.6"
    assert "mail for" in str(bounced[0]) and "loops back to myself" in str(bounced[0])
