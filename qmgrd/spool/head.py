"""What is known of a message at MAIL: ``EnvelopeHead`` and its T, S, A and W records.

Moved out of ``qmgrd.spool.writer`` (which re-exports it) to keep that module
under ~400 lines. ``encode()`` gives the records in the order
``records.encode_queue_file`` writes them.

Why a named tuple and not a frozen dataclass
--------------------------------------------
The head crosses from the listener into the spool writer, so it is
immutable (STYLE.md 5). It is built once per message on the intake path,
and a frozen dataclass's ``__init__`` pays an ``object.__setattr__`` call
per field (11 here): measured with callgrind on ``bench/intakepath.py``
that was most of the head's cost. A ``NamedTuple`` is as immutable
(assignment raises ``AttributeError``) and built by one ``tuple.__new__``.
Its tuple nature is harmless here: no code compares a head with ``==``
(only tests, head to head), indexes it, unpacks it or checks
``isinstance`` against ``tuple``; its ``repr`` is the dataclass's.
"""

from __future__ import annotations

from typing import NamedTuple

from qmgrd.errors import InvariantError
from qmgrd.spool.records import REC_ATTR, REC_SENDER, REC_TIME, REC_WARN, encode_record

__all__ = ["EnvelopeHead"]

_RETS = (None, "FULL", "HDRS")
_BODIES = (None, "7BIT", "8BITMIME")


class _HeadFields(NamedTuple):
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


_new = tuple.__new__


class EnvelopeHead(_HeadFields):
    """What is known of a message at MAIL: everything but recipients and content."""

    __slots__ = ()

    def __new__(
        cls,
        sender: str,
        arrival_time: float,
        envid: str | None = None,
        ret: str | None = None,
        smtputf8: bool = False,
        body: str | None = None,
        client_name: str | None = None,
        client_addr: str | None = None,
        helo: str | None = None,
        warn_time: int | None = None,
        sasl_username: str | None = None,
    ) -> EnvelopeHead:
        if ret not in _RETS:
            raise InvariantError(f"bad RET value {ret!r}")
        if body not in _BODIES:
            raise InvariantError(f"bad BODY value {body!r}")
        return _new(
            cls,
            (sender, arrival_time, envid, ret, smtputf8, body, client_name, client_addr, helo,
             warn_time, sasl_username),
        )

    def encode(self) -> bytes:
        """The T, S, A and W records, in the order ``encode_queue_file`` writes them."""
        sec, usec = divmod(round(self.arrival_time * 1e6), 1_000_000)
        out = encode_record(REC_TIME, b"%d %d" % (sec, usec)) + encode_record(
            REC_SENDER, self.sender.encode("utf-8", "surrogateescape")
        )
        # The A records, in this order, each only when set: "name=value", value UTF-8.
        if self.envid is not None:
            out += _attr(b"envid=", self.envid)
        if self.ret is not None:
            out += _attr(b"ret=", self.ret)
        if self.smtputf8:
            out += encode_record(REC_ATTR, b"smtputf8=1")
        if self.body is not None:
            out += _attr(b"body=", self.body)
        if self.client_name is not None:
            out += _attr(b"client_name=", self.client_name)
        if self.client_addr is not None:
            out += _attr(b"client_addr=", self.client_addr)
        if self.helo is not None:
            out += _attr(b"helo=", self.helo)
        if self.sasl_username is not None:
            out += _attr(b"sasl_username=", self.sasl_username)
        if self.warn_time is not None:
            out += encode_record(REC_WARN, b"%15d" % self.warn_time)
        return out


def _attr(name: bytes, value: str) -> bytes:
    return encode_record(REC_ATTR, name + value.encode("utf-8", "surrogateescape"))
