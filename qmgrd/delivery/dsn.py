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
3. the original message: ``message/rfc822`` when the full content is given and
   fits in ``bounce_size_limit`` bytes, else ``text/rfc822-headers`` (RET=HDRS,
   delay notices, or too large), cut after the last whole line that fits.

Theory of operation (containment, issue 9): the original is untrusted bytes.
It is never parsed nor re-serialised (CPython's header folding loops for ever
on some headers, gh-138223, and raises on others); it is copied line by line:
line ends made CRLF, NUL and bare CR replaced by ``?``, lines over 998 octets
broken with CRLF SP (as Postfix's ``smtp_line_length_limit`` does). Only a
prefix of ``bounce_size_limit`` + 2 bytes is ever looked at, so the work is
linear in the limit, whatever the message size. Our own parts are written by
hand from masked text: control characters become ``?``, the delivery-status
part is ASCII only (non-ASCII addresses as RFC 6533 ``utf-8`` xtext), long
values are folded at white space and hard-broken below 998 octets. The
boundary is derived from a hash of every part and checked not to occur in
any of them. Each part declares 7bit or 8bit from its bytes; so does the top
level. Composition cannot raise on any content (only on a bad call: no
recipients). The copy of the original and the boundary live in ``dsncopy``.

``wants_notice`` / ``filter_notify`` apply DSN NOTIFY (RFC 3461 §4.1): NEVER
suppresses every notice; an explicit list without FAILURE (or DELAY) suppresses
that kind; no NOTIFY means Postfix's default (failure and delay notices).
"""

from __future__ import annotations

import email.utils
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from qmgrd.delivery.agent import Recipient
from qmgrd.delivery.dsncopy import MAX_LINE, attachment, choose_boundary, cte

NoticeKind = Literal["failure", "delay", "success"]

BOUNCE_SIZE_LIMIT = 50000  # Postfix's bounce_size_limit default
_WRAP = 79  # Postfix's bounce_print_wrap width
_INDENT = "    "  # Postfix's continuation indent for wrapped report lines

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


# ---------------------------------------------------------------- our own text

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_NON_ASCII_PRINTABLE = re.compile(r"[^\x20-\x7e]")
_XTEXT_UNSAFE = re.compile(r"[^\x21-\x2a\x2c-\x3c\x3e-\x5b\x5d-\x7e]")


def _one_line(text: str) -> str:
    """Whitespace runs (CR and LF included) collapsed; control characters masked."""
    return _CONTROL.sub("?", " ".join(text.split()))


def _ascii(text: str) -> str:
    """One line of printable ASCII (what message/delivery-status fields may hold)."""
    return _NON_ASCII_PRINTABLE.sub("?", _one_line(text))


def _typed(address: str) -> str:
    """``type; address`` for a DSN field; non-ASCII as RFC 6533 utf-8-addr-xtext."""
    address = _one_line(address)
    if ";" in address:
        return _ascii(address)
    if address.isascii():
        return f"rfc822; {address}"
    return "utf-8; " + _XTEXT_UNSAFE.sub(lambda m: f"\\x{{{ord(m.group()):X}}}", address)


def _fold(first: str, width: int = _WRAP) -> list[str]:
    """``first`` wrapped at white space to ``width``; words too long for a line are cut.

    Continuation lines start with Postfix's four-space indent (valid header
    folding white space); no line exceeds MAX_LINE characters.
    """
    lines: list[str] = []
    line = ""
    for word in first.split(" "):
        room = MAX_LINE - len(_INDENT) - 1
        while len(word) > room:
            if line:
                lines.append(line)
            lines.append((_INDENT if lines else "") + word[:room])
            line, word = "", word[room:]
        if not line:
            line = (_INDENT if lines else "") + word
        elif len(line) + 1 + len(word) > width:
            lines.append(line)
            line = _INDENT + word
        else:
            line += " " + word
    lines.append(line)
    return lines


def _rfc_date(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return email.utils.format_datetime(when)


def _human_duration(seconds: float) -> str:
    hours = seconds / 3600
    if hours < 48:
        return f"{hours:.1f} hours"
    return f"{hours / 24:.1f} days"


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


def _crlf(lines: Iterable[str]) -> bytes:
    return "".join(line + "\r\n" for line in lines).encode("utf-8")


def _text_part(
    kind: str, mta: str, recipients: Sequence[DsnRecipient], delay: float, lifetime: float
) -> bytes:
    if kind == "failure":
        intro = _INTRO_FAILURE.format(mta=mta)
    else:
        intro = _INTRO_DELAY.format(
            mta=mta, delay=_human_duration(delay), lifetime=_human_duration(lifetime)
        )
    lines = intro.splitlines()
    for rcpt in recipients:
        address = _one_line(rcpt.final_recipient.split(";")[-1])
        detail = _one_line(rcpt.diagnostic_code or "") or rcpt.status
        lines.append("")
        lines.extend(_fold(f"<{address}>: {detail}"))
    return _crlf(lines)


def _status_part(
    mta: str,
    queue_id: str,
    sender: str,
    arrival: datetime,
    envid: str | None,
    recipients: Sequence[DsnRecipient],
) -> bytes:
    """message/delivery-status: field groups separated by blank lines (RFC 3464 §2.1)."""
    lines = [f"Reporting-MTA: dns; {_ascii(mta)}", f"X-Queue-ID: {_ascii(queue_id)}"]
    lines.extend(_fold(f"X-Original-Sender: {_typed(sender or '<>')}"))
    if envid:
        lines.extend(_fold(f"Original-Envelope-Id: {_ascii(envid)}"))
    lines.append(f"Arrival-Date: {_rfc_date(arrival)}")
    for rcpt in recipients:
        lines.append("")
        lines.extend(_fold(f"Final-Recipient: {_typed(rcpt.final_recipient)}"))
        if rcpt.original_recipient:
            lines.extend(_fold(f"Original-Recipient: {_typed(rcpt.original_recipient)}"))
        lines.append(f"Action: {rcpt.action}")
        lines.append(f"Status: {rcpt.status}")
        if rcpt.remote_mta and _ascii(rcpt.remote_mta):
            lines.extend(_fold(f"Remote-MTA: dns; {_ascii(rcpt.remote_mta)}"))
        if rcpt.diagnostic_code and _ascii(rcpt.diagnostic_code):
            lines.extend(_fold(f"Diagnostic-Code: smtp; {_ascii(rcpt.diagnostic_code)}"))
        if rcpt.last_attempt is not None:
            lines.append(f"Last-Attempt-Date: {_rfc_date(rcpt.last_attempt)}")
        if rcpt.will_retry_until is not None:
            lines.append(f"Will-Retry-Until: {_rfc_date(rcpt.will_retry_until)}")
    return _crlf(lines)


# ---------------------------------------------------------------- assembly


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
    bounce_size_limit: int = BOUNCE_SIZE_LIMIT,
) -> bytes:
    """Build a complete RFC 3464 notice from the null sender to ``original_sender``.

    ``original_message`` (the full content) is attached as message/rfc822 when
    given and no larger than ``bounce_size_limit``; otherwise the header section
    of ``original_message`` or ``original_headers`` (which may be the whole
    content) is attached as text/rfc822-headers, within the limit. A caller may
    pass only the first ``bounce_size_limit + 1`` bytes of a large message: the
    result is the same. ``now`` is injected so tests are deterministic. Never
    raises on any content; ValueError only when ``recipients`` is empty.
    """
    if not recipients:
        raise ValueError("a delivery status notification needs at least one recipient")
    now = now or datetime.now(UTC)
    limit = max(1, bounce_size_limit)
    mta = _ascii(reporting_mta)
    text = _text_part(kind, mta, recipients, delay_seconds, lifetime_seconds)
    status = _status_part(mta, queue_id, original_sender, arrival_time, envid, recipients)
    source = original_headers if original_message is None else original_message
    attached, whole = attachment(source, limit, headers_only=original_message is None)

    charset = "us-ascii" if text.isascii() else "utf-8"
    if whole:
        original_head = "Content-Description: Undelivered Message\r\nContent-Type: message/rfc822"
    else:
        original_head = (
            "Content-Description: Undelivered Message Headers\r\nContent-Type: text/rfc822-headers"
        )
    bodies = (
        (f"Content-Description: Notification\r\nContent-Type: text/plain; charset={charset}", text),
        ("Content-Description: Delivery report\r\nContent-Type: message/delivery-status", status),
        (original_head, attached),
    )
    stamp = int(now.timestamp())
    boundary = choose_boundary(f"{queue_id}.{stamp}", [body for _head, body in bodies])
    subject = (
        "Undelivered Mail Returned to Sender"
        if kind == "failure"
        else "Delayed Mail (still being retried)"
    )
    msgid = message_id or f"<{now.strftime('%Y%m%d%H%M%S')}.{queue_id}@{reporting_mta}>"
    head = [
        f"From: MAILER-DAEMON@{mta} (Mail Delivery System)",
        *_fold(f"To: {_one_line(original_sender) or '<>'}"),
        f"Subject: {subject}",
        f"Date: {_rfc_date(now)}",
        *_fold(f"Message-ID: {_ascii(msgid)}"),
        "Auto-Submitted: auto-replied",
        "MIME-Version: 1.0",
        "Content-Type: multipart/report; report-type=delivery-status;",
        f'{_INDENT}boundary="{boundary}"',
        f"Content-Transfer-Encoding: {cte(text + status + attached)}",
        "",
        "This is a MIME-encapsulated message.",
        "",
    ]
    out = [_crlf(head)]
    for part_head, body in bodies:
        out.append(f"--{boundary}\r\n{part_head}\r\n".encode("ascii"))
        out.append(f"Content-Transfer-Encoding: {cte(body)}\r\n\r\n".encode("ascii"))
        out.append(body)
        out.append(b"\r\n")  # the CRLF that belongs to the next delimiter (RFC 2046 §5.1.1)
    out.append(f"--{boundary}--\r\n".encode("ascii"))
    return b"".join(out)
