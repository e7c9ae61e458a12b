"""What is known of a message at MAIL: ``EnvelopeHead`` and its T, S, A and W records.

Moved out of ``qmgrd.spool.writer`` (which re-exports it) to keep that module
under ~400 lines. ``encode()`` gives the records in the order
``records.encode_queue_file`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgrd.errors import InvariantError
from qmgrd.spool.records import REC_ATTR, REC_SENDER, REC_TIME, REC_WARN, encode_record

__all__ = ["EnvelopeHead"]


@dataclass(frozen=True, slots=True)
class EnvelopeHead:
    """What is known of a message at MAIL: everything but recipients and content."""

    sender: str  # "" = null sender
    arrival_time: float
    envid: str | None = None
    ret: str | None = None  # FULL | HDRS
    smtputf8: bool = False
    body: str | None = None  # 7BIT | 8BITMIME
    client_name: str | None = None
    client_addr: str | None = None
    helo: str | None = None
    warn_time: int | None = None
    sasl_username: str | None = None  # the session's AUTH identity (fairness keys)

    def __post_init__(self) -> None:
        if self.ret not in (None, "FULL", "HDRS"):
            raise InvariantError(f"bad RET value {self.ret!r}")
        if self.body not in (None, "7BIT", "8BITMIME"):
            raise InvariantError(f"bad BODY value {self.body!r}")

    def encode(self) -> bytes:
        """The T, S, A and W records, in the order ``encode_queue_file`` writes them."""

        def enc(text: str) -> bytes:
            return text.encode("utf-8", "surrogateescape")

        sec, usec = divmod(round(self.arrival_time * 1e6), 1_000_000)
        recs = [
            encode_record(REC_TIME, f"{sec} {usec}".encode()),
            encode_record(REC_SENDER, enc(self.sender)),
        ]
        attrs = {
            "envid": self.envid,
            "ret": self.ret,
            "smtputf8": "1" if self.smtputf8 else None,
            "body": self.body,
            "client_name": self.client_name,
            "client_addr": self.client_addr,
            "helo": self.helo,
            "sasl_username": self.sasl_username,
        }
        recs += [
            encode_record(REC_ATTR, enc(f"{k}={v}")) for k, v in attrs.items() if v is not None
        ]
        if self.warn_time is not None:
            recs.append(encode_record(REC_WARN, b"%15d" % self.warn_time))
        return b"".join(recs)
