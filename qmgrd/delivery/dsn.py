"""Delivery status notifications: RFC 3464 bounce and delay messages (composition only).

The engine decides when a notice is due and enqueues it from the null sender
(DESIGN §7); this module only builds the bytes. ``compose_dsn`` returns one
complete ``multipart/report; report-type=delivery-status`` message:

1. a human-readable ``text/plain`` part (Postfix's wording);
2. a ``message/delivery-status`` part: per-message fields (``Reporting-MTA``,
   ``X-Postfix-Queue-ID``-style ``X-Queue-ID``, ``X-Original-Envelope-Id``,
   ``Arrival-Date``) and one block per recipient (``Final-Recipient``,
   ``Original-Recipient``, ``Action``, ``Status``, ``Remote-MTA``,
   ``Diagnostic-Code``, ``Last-Attempt-Date``, ``Will-Retry-Until``);
3. the original message: ``message/rfc822`` when the full content is given,
   else ``text/rfc822-headers`` (RET=HDRS, delay notices, or too large).

``wants_notice`` / ``filter_notify`` apply DSN NOTIFY (RFC 3461 §4.1): NEVER
suppresses every notice; an explicit list without FAILURE (or DELAY) suppresses
that kind; no NOTIFY means Postfix's default (failure and delay notices).
"""

from __future__ import annotations

import email
import email.policy
import email.utils
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage, Message
from typing import Literal

from qmgrd.delivery.agent import Recipient

NoticeKind = Literal["failure", "delay", "success"]

_NOTIFY_KEYWORD: dict[NoticeKind, str] = {
    "failure": "FAILURE",
    "delay": "DELAY",
    "success": "SUCCESS",
}


def wants_notice(recipient: Recipient, kind: NoticeKind) -> bool:
    """Whether the sender asked (or by default gets) a notice of ``kind`` for this recipient."""
    notify = {word.upper() for word in recipient.notify}
    if "NEVER" in notify:
        return False
    if not notify:
        return kind != "success"
    return _NOTIFY_KEYWORD[kind] in notify


def filter_notify(recipients: Iterable[Recipient], kind: NoticeKind) -> list[Recipient]:
    """The recipients that should appear in a notice of ``kind`` (NOTIFY honoured)."""
    return [r for r in recipients if wants_notice(r, kind)]


@dataclass(frozen=True, slots=True)
class DsnRecipient:
    """One recipient block of a delivery-status report."""

    final_recipient: str  # address, "rfc822;" added if no type
    action: str  # failed | delayed | delivered | relayed | expanded
    status: str  # e.g. "5.1.1"
    diagnostic_code: str | None = None  # e.g. the remote reply "550 5.1.1 user unknown"
    remote_mta: str | None = None  # host name of the server that replied
    original_recipient: str | None = None  # ORCPT, e.g. "rfc822;a@b"
    last_attempt: datetime | None = None
    will_retry_until: datetime | None = None  # delay notices

    def __post_init__(self) -> None:
        """Reject values that would produce a malformed report."""
        if self.action not in ("failed", "delayed", "delivered", "relayed", "expanded"):
            raise ValueError(f"bad DSN action {self.action!r}")
        parts = self.status.split(".")
        if len(parts) != 3 or not all(p.isdigit() for p in parts) or parts[0] not in "245":
            raise ValueError(f"bad DSN status {self.status!r}")


def _typed(address: str) -> str:
    return address if ";" in address else f"rfc822; {address}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _rfc_date(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return email.utils.format_datetime(when)


_INTRO_FAILURE = """\
This is the mail system at host {mta}.

I'm sorry to have to inform you that your message could not
be delivered to one or more recipients. It's attached below.

For further assistance, please send mail to postmaster.

If you do so, please include this problem report. You can
delete your own text from the attached returned message.

                   The mail system
"""

_INTRO_DELAY = """\
This is the mail system at host {mta}.

####################################################################
# THIS IS A WARNING ONLY.  YOU DO NOT NEED TO RESEND YOUR MESSAGE. #
####################################################################

Your message could not be delivered for {delay}. It will be retried until
it is {lifetime} old.

For further assistance, please send mail to postmaster.

If you do so, please include this problem report. You can
delete your own text from the attached returned message.

                   The mail system
"""


def _human_duration(seconds: float) -> str:
    hours = seconds / 3600
    if hours < 48:
        return f"{hours:.1f} hours"
    return f"{hours / 24:.1f} days"


def compose_dsn(
    *,
    reporting_mta: str,
    queue_id: str,
    original_sender: str,
    arrival_time: datetime,
    recipients: Sequence[DsnRecipient],
    original_headers: bytes,
    original_message: bytes | None = None,
    kind: Literal["failure", "delay"] = "failure",
    envid: str | None = None,
    now: datetime | None = None,
    delay_seconds: float = 0.0,
    lifetime_seconds: float = 0.0,
    message_id: str | None = None,
) -> bytes:
    """Build a complete RFC 3464 notice from the null sender to ``original_sender``.

    ``original_message`` (the full content) is attached as message/rfc822 when
    given; otherwise ``original_headers`` are attached as text/rfc822-headers.
    ``now`` is injected so tests are deterministic.
    """
    if not recipients:
        raise ValueError("a delivery status notification needs at least one recipient")
    now = now or datetime.now(UTC)
    policy = email.policy.SMTP
    msg = EmailMessage(policy=policy)
    msg["From"] = f"MAILER-DAEMON@{reporting_mta} (Mail Delivery System)"
    msg["To"] = original_sender
    if kind == "failure":
        msg["Subject"] = "Undelivered Mail Returned to Sender"
    else:
        msg["Subject"] = "Delayed Mail (still being retried)"
    msg["Date"] = _rfc_date(now)
    msg["Message-ID"] = message_id or f"<{now.strftime('%Y%m%d%H%M%S')}.{queue_id}@{reporting_mta}>"
    msg["Auto-Submitted"] = "auto-replied"
    msg["MIME-Version"] = "1.0"
    msg.set_type("multipart/report")
    msg.set_param("report-type", "delivery-status")
    msg.preamble = "This is a MIME-encapsulated message.\n"

    if kind == "failure":
        intro = _INTRO_FAILURE.format(mta=reporting_mta)
    else:
        intro = _INTRO_DELAY.format(
            mta=reporting_mta,
            delay=_human_duration(delay_seconds),
            lifetime=_human_duration(lifetime_seconds),
        )
    lines = [intro]
    for rcpt in recipients:
        detail = rcpt.diagnostic_code or rcpt.status
        lines.append(f"<{rcpt.final_recipient.split(';')[-1].strip()}>: {_one_line(detail)}")
    text = EmailMessage(policy=policy)
    text.set_content("\n".join(lines) + "\n", subtype="plain", charset="utf-8")
    text["Content-Description"] = "Notification"

    # message/delivery-status: groups of fields separated by blank lines (RFC 3464 §2.1).
    groups: list[list[str]] = []
    per_message = [f"Reporting-MTA: dns; {reporting_mta}", f"X-Queue-ID: {queue_id}"]
    per_message.append(f"X-Original-Sender: rfc822; {original_sender or '<>'}")
    if envid:
        per_message.append(f"Original-Envelope-Id: {envid}")
    per_message.append(f"Arrival-Date: {_rfc_date(arrival_time)}")
    groups.append(per_message)
    for rcpt in recipients:
        block = [f"Final-Recipient: {_typed(rcpt.final_recipient)}"]
        if rcpt.original_recipient:
            block.append(f"Original-Recipient: {_typed(rcpt.original_recipient)}")
        block.append(f"Action: {rcpt.action}")
        block.append(f"Status: {rcpt.status}")
        if rcpt.remote_mta:
            block.append(f"Remote-MTA: dns; {rcpt.remote_mta}")
        if rcpt.diagnostic_code:
            block.append(f"Diagnostic-Code: smtp; {_one_line(rcpt.diagnostic_code)}")
        if rcpt.last_attempt is not None:
            block.append(f"Last-Attempt-Date: {_rfc_date(rcpt.last_attempt)}")
        if rcpt.will_retry_until is not None:
            block.append(f"Will-Retry-Until: {_rfc_date(rcpt.will_retry_until)}")
        groups.append(block)
    status = EmailMessage(policy=policy)
    status["Content-Description"] = "Delivery report"
    status["Content-Type"] = "message/delivery-status"
    blocks: list[Message | str] = []
    for group in groups:
        block_msg = Message(policy=policy)
        for line in group:
            name, _, value = line.partition(": ")
            block_msg[name] = value
        blocks.append(block_msg)
    status.set_payload(blocks)

    if original_message is not None:
        original = EmailMessage(policy=policy)
        original["Content-Description"] = "Undelivered Message"
        original["Content-Type"] = "message/rfc822"
        original["Content-Transfer-Encoding"] = "8bit"
        original.set_payload([email.message_from_bytes(original_message, policy=policy)])
    else:
        original = EmailMessage(policy=policy)
        original["Content-Description"] = "Undelivered Message Headers"
        original["Content-Type"] = "text/rfc822-headers"
        original["Content-Transfer-Encoding"] = "8bit"
        original.set_payload(_headers_only(original_headers).decode("ascii", "surrogateescape"))

    msg.attach(text)
    msg.attach(status)
    msg.attach(original)
    return msg.as_bytes(policy=policy)


def _headers_only(content: bytes) -> bytes:
    """The header section of a message (everything before the first empty line)."""
    for sep in (b"\r\n\r\n", b"\n\n"):
        end = content.find(sep)
        if end >= 0:
            return content[: end + len(sep) // 2]
    return content
