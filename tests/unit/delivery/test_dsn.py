"""RFC 3464 notice composition and NOTIFY filtering."""

from __future__ import annotations

import email
import email.policy
from datetime import UTC, datetime
from email.message import EmailMessage, Message

import pytest

from qmgrd.delivery.agent import Recipient
from qmgrd.delivery.dsn import DsnRecipient, compose_dsn, filter_notify, wants_notice

ORIGINAL = (
    "From: Alice <a@example.org>\r\nTo: b@example.com\r\nSubject: caf\u00e9\r\n"
    "Message-ID: <orig@example.org>\r\n\r\nBody line\r\n.dot\r\n"
).encode()
NOW = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _parse(raw: bytes) -> EmailMessage:
    msg = email.message_from_bytes(raw, policy=email.policy.SMTP)
    assert isinstance(msg, EmailMessage)
    return msg


def _parts(msg: Message) -> list[EmailMessage]:
    """The sub-parts of a multipart (or message/*) part."""
    payload = msg.get_payload()
    assert isinstance(payload, list), payload
    parts: list[EmailMessage] = []
    for part in payload:
        assert isinstance(part, EmailMessage), part
        parts.append(part)
    return parts


def _bounce(original_message: bytes | None = None) -> EmailMessage:
    raw = compose_dsn(
        reporting_mta="mx.example.org",
        queue_id="3F9A2B",
        original_sender="a@example.org",
        arrival_time=datetime(2024, 5, 1, 11, 0, tzinfo=UTC),
        recipients=[
            DsnRecipient(
                "b@example.com",
                "failed",
                "5.1.1",
                diagnostic_code="550 5.1.1 <b@example.com>: user unknown",
                remote_mta="mx.example.com",
                original_recipient="rfc822;B@example.com",
            ),
            DsnRecipient("c@example.com", "failed", "5.4.4", diagnostic_code=None),
        ],
        original_headers=ORIGINAL,
        now=NOW,
        original_message=original_message,
    )
    assert isinstance(raw, bytes)
    assert b"\r\n" in raw and b"\n" not in raw.replace(b"\r\n", b"")
    return _parse(raw)


def _status_groups(msg: Message) -> list[EmailMessage]:
    status = _parts(msg)[1]
    assert status.get_content_type() == "message/delivery-status"
    return _parts(status)


def test_bounce_is_multipart_report_delivery_status() -> None:
    """A bounce parses as multipart/report; report-type=delivery-status from MAILER-DAEMON."""
    msg = _bounce()
    assert msg.get_content_type() == "multipart/report"
    assert msg.get_param("report-type") == "delivery-status"
    assert msg["To"] == "a@example.org"
    assert msg["From"].startswith("MAILER-DAEMON@mx.example.org")
    assert msg["Auto-Submitted"] == "auto-replied"
    parts = _parts(msg)
    assert [p.get_content_type() for p in parts] == [
        "text/plain",
        "message/delivery-status",
        "text/rfc822-headers",
    ]


def test_per_recipient_fields() -> None:
    """Each recipient block carries Final-Recipient, Action, Status, Remote-MTA, Diagnostic-Code."""
    groups = _status_groups(_bounce())
    per_message, first, second = groups
    assert per_message["Reporting-MTA"] == "dns; mx.example.org"
    assert per_message["Arrival-Date"]
    assert first["Final-Recipient"] == "rfc822; b@example.com"
    assert first["Original-Recipient"] == "rfc822;B@example.com"
    assert first["Action"] == "failed"
    assert first["Status"] == "5.1.1"
    assert first["Remote-MTA"] == "dns; mx.example.com"
    assert first["Diagnostic-Code"] == "smtp; 550 5.1.1 <b@example.com>: user unknown"
    assert second["Final-Recipient"] == "rfc822; c@example.com"
    assert second["Status"] == "5.4.4"
    assert second["Diagnostic-Code"] is None


def test_headers_attached_without_body() -> None:
    """Without the full message the original headers (only) are attached, 8-bit intact."""
    raw = _parts(_bounce())[2].get_payload(decode=True)
    assert isinstance(raw, bytes)
    assert b"Subject: caf\xc3\xa9" in raw
    assert b"Body line" not in raw


def test_full_message_attached_as_rfc822() -> None:
    """With the full content the original is attached as message/rfc822."""
    msg = _bounce(original_message=ORIGINAL)
    part = _parts(msg)[2]
    assert part.get_content_type() == "message/rfc822"
    inner = _parts(part)[0]
    assert inner["Message-ID"] == "<orig@example.org>"


def test_delay_notice() -> None:
    """A delay notice has Action delayed and Will-Retry-Until, and says it is a warning."""
    raw = compose_dsn(
        reporting_mta="mx.example.org",
        queue_id="Q1",
        original_sender="a@example.org",
        arrival_time=NOW,
        recipients=[
            DsnRecipient(
                "b@example.com",
                "delayed",
                "4.4.1",
                diagnostic_code="connect to mx[1.2.3.4]:25: Connection refused",
                will_retry_until=datetime(2024, 5, 6, tzinfo=UTC),
            )
        ],
        original_headers=ORIGINAL,
        kind="delay",
        now=NOW,
        delay_seconds=4 * 3600,
        lifetime_seconds=5 * 86400,
    )
    msg = _parse(raw)
    assert msg["Subject"].startswith("Delayed Mail")
    text = _parts(msg)[0].get_content()
    assert "WARNING ONLY" in text and "4.0 hours" in text
    block = _status_groups(msg)[1]
    assert block["Action"] == "delayed"
    assert block["Will-Retry-Until"]


def test_bad_status_rejected() -> None:
    """A malformed status code is refused at construction."""
    with pytest.raises(ValueError):
        DsnRecipient("b@example.com", "failed", "550")


def test_notify_filter() -> None:
    """NOTIFY=NEVER suppresses notices; an explicit list limits them; none means failure+delay."""
    default = Recipient("a@x", 0)
    never = Recipient("b@x", 1, notify=frozenset({"NEVER"}))
    success_only = Recipient("c@x", 2, notify=frozenset({"SUCCESS"}))
    delay = Recipient("d@x", 3, notify=frozenset({"DELAY", "FAILURE"}))
    everyone = [default, never, success_only, delay]
    assert filter_notify(everyone, "failure") == [default, delay]
    assert filter_notify(everyone, "delay") == [default, delay]
    assert filter_notify(everyone, "success") == [success_only]
    assert not wants_notice(never, "failure")
