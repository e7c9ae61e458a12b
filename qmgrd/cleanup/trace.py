"""The headers cleanup writes: Received:, Message-ID:, Date: (Postfix's shapes).

All functions are pure: time is an argument (seconds since the epoch) and
the zone is the process's local zone, as Postfix's mail_date() uses.
"""

from __future__ import annotations

import time

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def mail_date(now: float) -> str:
    """RFC 5322 date as Postfix writes it: ``Mon, 23 Nov 2026 08:43:57 +0000 (UTC)``."""
    tm = time.localtime(now)
    offset = tm.tm_gmtoff or 0
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset) // 60, 60)
    zone = f" ({tm.tm_zone})" if tm.tm_zone and tm.tm_zone.isalpha() else ""
    return (
        f"{_DAYS[tm.tm_wday]}, {tm.tm_mday} {_MONTHS[tm.tm_mon - 1]} {tm.tm_year} "
        f"{tm.tm_hour:02d}:{tm.tm_min:02d}:{tm.tm_sec:02d} {sign}{hours:02d}{minutes:02d}{zone}"
    )


def message_id(now: float, queue_id: str, myhostname: str) -> str:
    """``<YYYYMMDDhhmmss.QUEUEID@myhostname>`` (UTC time, as Postfix's cleanup)."""
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(now))
    return f"<{stamp}.{queue_id}@{myhostname}>"


def protocol_name(*, esmtp: bool, tls: bool, auth: bool) -> str:
    """SMTP, ESMTP, ESMTPS, ESMTPA, ESMTPSA (RFC 3848), as in Postfix's Received."""
    if not esmtp:
        return "SMTP"
    return "ESMTP" + ("S" if tls else "") + ("A" if auth else "")


def received_header(
    *,
    myhostname: str,
    mail_name: str,
    queue_id: str,
    now: float,
    helo: str | None,
    client_name: str | None,
    client_addr: str | None,
    protocol: str,
    recipients: tuple[str, ...],
    uid: int | None = None,
) -> str:
    """The Received: header text (lines joined by ``\\n\\t``, no final newline).

    SMTP mail: ``from HELO (NAME [ADDR])`` ... ``with PROTO id ID`` ...
    ``for <rcpt>`` only when there is exactly one recipient, as Postfix.
    Local submission (pickup): ``by HOST (NAME, from userid UID) id ID``.
    """
    lines: list[str] = []
    if client_addr is not None:
        name = client_name or "unknown"
        addr = client_addr if ":" not in client_addr else f"IPv6:{client_addr}"
        lines.append(f"Received: from {helo or name} ({name} [{addr}])")
        lines.append(f"by {myhostname} ({mail_name}) with {protocol} id {queue_id}")
    else:
        who = f"{mail_name}, from userid {uid}" if uid is not None else mail_name
        lines.append(f"Received: by {myhostname} ({who})")
        lines.append(f"id {queue_id}")
    date = mail_date(now)
    if len(recipients) == 1:
        lines.append(f"for <{recipients[0]}>; {date}")
    else:
        lines[-1] += f"; {date}"
    return "\n\t".join(lines)
