"""The records a finish writes or sends: notice envelopes and the reasons it makes up.

Pure helpers of ``qmgrd.daemon.finishing`` (moved out to keep that module
under ~400 lines): the envelope of a bounce or delay notice, the ``4.3.0``
reasons of a message deferred after an internal error, the ``4.7.0`` reasons
of a forced expiry, and the records whose recipient wants a notice. They
read the queue file and the defer log (call from a worker thread).
"""

from __future__ import annotations

from qmgrd.daemon.notices import NoticeKind
from qmgrd.daemon.table import ActiveMessage
from qmgrd.delivery.agent import Recipient
from qmgrd.delivery.dsn import wants_notice
from qmgrd.errors import SpoolError
from qmgrd.spool import Envelope, ReasonRecord, RecipientSpec, Spool

__all__ = [
    "FORCED_EXPIRE_DSN",
    "FORCED_EXPIRE_TEXT",
    "INTERNAL_DSN",
    "expire_reasons",
    "internal_reasons",
    "notice_envelope",
    "wanting_notice",
]

INTERNAL_DSN = "4.3.0"


def notice_envelope(sender: str, notice: bytes, now: float) -> Envelope:
    """The notice's envelope: from the null sender; BODY=8BITMIME when it carries 8-bit bytes
    (an attached original), so the next hop is told (RFC 6152)."""
    return Envelope(
        sender="",
        recipients=(RecipientSpec(sender),),
        arrival_time=now,
        body=None if notice.isascii() else "8BITMIME",
        client_name="localhost",
        client_addr="127.0.0.1",
    )


def internal_reasons(msg: ActiveMessage, reason: str, now: float) -> list[ReasonRecord]:
    """A ``4.3.0`` defer reason for every recipient still to deliver (best effort)."""
    try:
        records = msg.qf.read_all_recipients()
    except (OSError, SpoolError):
        return []
    return [
        ReasonRecord(r.address, INTERNAL_DSN, "delayed", reason, now, "none", r.orcpt,
                     tuple(sorted(r.notify)))
        for r in records
    ]


FORCED_EXPIRE_DSN = "4.7.0"
FORCED_EXPIRE_TEXT = "message is administratively expired"  # Postfix's words (postsuper -e)


def expire_reasons(spool: Spool, msg: ActiveMessage, now: float) -> list[ReasonRecord]:
    """A ``4.7.0`` reason for every recipient still to deliver that has none from this pass."""
    have = {r.address for r in spool.read_reasons("defer", msg.queue_id)}
    return [
        ReasonRecord(r.address, FORCED_EXPIRE_DSN, "delayed", FORCED_EXPIRE_TEXT, now, "none",
                     r.orcpt, tuple(sorted(r.notify)))
        for r in msg.qf.read_all_recipients()
        if r.address not in have
    ]


def wanting_notice(records: tuple[ReasonRecord, ...] | list[ReasonRecord], kind: NoticeKind
            ) -> list[ReasonRecord]:
    """The records whose recipient wants a ``kind`` notice (DSN NOTIFY, RFC 3461 §4.1)."""
    return [
        r
        for r in records
        if wants_notice(Recipient(r.address, 0, r.orcpt, frozenset(r.notify)), kind)
    ]
