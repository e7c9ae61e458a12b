"""The headers cleanup writes: Received:, Message-ID:, Date: (Postfix's shapes).

All functions are pure: time is an argument (seconds since the epoch) and
the zone is the process's local zone, as Postfix's mail_date() uses.
``LastDate`` is ``mail_date`` remembering its last second (the messages of one
second share the text; formatting it costs more than the rest of Received:).
"""

from __future__ import annotations

import math
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


class LastDate:
    """``mail_date(now)``, computed once per second of ``now`` (the last one is kept).

    ``mail_date`` depends on the whole second only (``time.localtime`` floors).
    One tuple holds the second and its text, so threads sharing it never pair
    a second with another second's text.
    """

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[int, str] | None = None

    def __call__(self, now: float) -> str:
        second = math.floor(now)
        last = self._last
        if last is not None and last[0] == second:
            return last[1]
        text = mail_date(now)
        self._last = (second, text)
        return text


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
    date: str | None = None,
) -> str:
    """The Received: header text (lines joined by ``\\n\\t``, no final newline).

    SMTP mail: ``from HELO (NAME [ADDR])`` ... ``with PROTO id ID`` ...
    ``for <rcpt>`` only when there is exactly one recipient, as Postfix.
    Local submission (pickup): ``by HOST (NAME, from userid UID) id ID``.
    ``date`` is ``mail_date(now)`` when the caller has it already.
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
    if date is None:
        date = mail_date(now)
    if len(recipients) == 1:
        lines.append(f"for <{recipients[0]}>; {date}")
    else:
        lines[-1] += f"; {date}"
    return "\n\t".join(lines)
