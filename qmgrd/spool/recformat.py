"""The queue-file record format: the layout, its encoding and the record stream.

Theory of operation (modelled on Postfix's record format, notes §11)
---------------------------------------------------------------------
A queue file is a sequence of records: one type byte, the payload length as
a little-endian base-128 varint (7 bits per byte, high bit = more), then the
payload. Payloads are raw bytes (NULs, bare CR or LF allowed). Text is UTF-8
with ``surrogateescape``, so any string aiosmtpd hands us round-trips.

Layout, in order::

    C  size record, always first, always at offset 0, fixed width (63 bytes):
       "%15d %15d %15d %15d" = content size, content offset, recipient count, flags
    T  arrival time "sec usec"
    S  sender ("" = null sender)
    A  envelope attribute "name=value" (envid, ret, smtputf8, body, client_name,
       client_addr, helo, sasl_username), zero or more; ``sasl_username`` (the
       AUTH identity of the session, for fairness keys) is optional: files
       written before it existed read as unauthenticated
    W  delay-warning time, "%15d" seconds, rewritten in place (-1 = warned); optional
    R  recipient still to deliver; D = an R whose type byte was overwritten
       (done). Payload: one flags byte (bits 0-3 = DSN NOTIFY NEVER, SUCCESS,
       FAILURE, DELAY; bit 7 = an ORCPT follows), [varint length + ORCPT], address
    M  the content: the message exactly as received after SMTP dot-unstuffing,
       one record, so an agent streams one raw byte range
    E  end marker, empty; its presence at content offset + content size is what
       makes a file "complete"

Unlike Postfix, a recipient is one self-contained record (ORCPT and NOTIFY
inside it), so a recipient is exactly "the record at this offset": batches
resume at an R offset and a done mark is one byte at that offset.

The reader and the in-place writes (``qmgrd.spool.records``) build on this
module; every name here is also importable from there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qmgrd.errors import InvariantError, SpoolError

REC_SIZE = ord("C")
REC_TIME = ord("T")
REC_SENDER = ord("S")
REC_ATTR = ord("A")
REC_WARN = ord("W")
REC_RCPT = ord("R")
REC_DONE = ord("D")
REC_CONTENT = ord("M")
REC_END = ord("E")

_SIZE_FORMAT = "%15d %15d %15d %15d"
_SIZE_PAYLOAD_LEN = 63
_WARN_PAYLOAD_LEN = 15
WARNED = -1  # W value after the delay warning was sent

NOTIFY_KEYWORDS = ("NEVER", "SUCCESS", "FAILURE", "DELAY")
_NOTIFY_BITS = {name: 1 << i for i, name in enumerate(NOTIFY_KEYWORDS)}
_HAS_ORCPT = 0x80
_ATTR_NAMES = (
    "envid", "ret", "smtputf8", "body", "client_name", "client_addr", "helo", "sasl_username"
)

_READ_CHUNK = 65536


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _dec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


_ONE_BYTE = tuple(bytes((i,)) for i in range(0x80))  # the varints below 128 (most lengths)


def encode_varint(value: int) -> bytes:
    """Little-endian base-128 encoding of a non-negative int."""
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        raise InvariantError(f"negative record length {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_record(rtype: int, payload: bytes) -> bytes:
    """One record: type byte, varint length, payload."""
    size = len(payload)
    if size < 0x80:  # a one-byte length (most records)
        return bytes((rtype, size)) + payload
    return bytes((rtype,)) + encode_varint(size) + payload


def _setters(cls: type, names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slot setters of a frozen slotted dataclass, for its own ``__init__``.

    The generated ``__init__`` of a frozen dataclass calls ``object.__setattr__`` per field,
    about twice the cost of the slot's own setter (callgrind); a ``RecipientSpec`` is built
    per accepted recipient and a ``RecipientRecord`` per recipient read. The class stays
    frozen (its ``__setattr__`` refuses), with the generated ``==``, ``hash`` and ``repr``;
    ``tests/unit/spool/test_record_types.py`` checks each ``__init__`` takes every field.
    """
    return tuple(cls.__dict__[name].__set__ for name in names.split())


_NO_NOTIFY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True, init=False)
class RecipientSpec:
    """A recipient as accepted at intake, with its DSN parameters (RFC 3461)."""

    address: str
    orcpt: str | None = None  # "addr-type;xtext" as given, e.g. "rfc822;a@b"
    notify: frozenset[str] = frozenset()  # subset of NOTIFY_KEYWORDS; empty = not given

    def __init__(
        self, address: str, orcpt: str | None = None, notify: frozenset[str] = _NO_NOTIFY
    ) -> None:
        """The fields, in order (see ``_setters``); NOTIFY is checked when given."""
        _RS_ADDRESS(self, address)
        _RS_ORCPT(self, orcpt)
        _RS_NOTIFY(self, notify)
        if notify:  # NOTIFY not given (most recipients): nothing to check
            self._check_notify()

    def _check_notify(self) -> None:
        unknown = self.notify - _NOTIFY_BITS.keys()
        if unknown:
            raise InvariantError(f"unknown NOTIFY keywords {sorted(unknown)}")
        if "NEVER" in self.notify and len(self.notify) > 1:
            raise InvariantError("NOTIFY=NEVER combined with other keywords")


_RS_ADDRESS, _RS_ORCPT, _RS_NOTIFY = _setters(RecipientSpec, "address orcpt notify")


@dataclass(frozen=True, slots=True)
class Envelope:
    """Everything the listener learned about one message, except its content."""

    sender: str  # "" = null sender
    recipients: tuple[RecipientSpec, ...]
    arrival_time: float  # seconds since the epoch; stored with microsecond precision
    envid: str | None = None  # DSN ENVID (xtext, as given)
    ret: str | None = None  # DSN RET: FULL | HDRS
    smtputf8: bool = False
    body: str | None = None  # 7BIT | 8BITMIME | None (not given)
    client_name: str | None = None
    client_addr: str | None = None
    helo: str | None = None
    warn_time: int | None = None  # absolute delay-warning time; None = no W record
    sasl_username: str | None = None  # the session's AUTH identity; None = not authenticated

    def __post_init__(self) -> None:
        if not self.recipients:
            raise InvariantError("an envelope needs at least one recipient")
        if self.ret not in (None, "FULL", "HDRS"):
            raise InvariantError(f"bad RET value {self.ret!r}")
        if self.body not in (None, "7BIT", "8BITMIME"):
            raise InvariantError(f"bad BODY value {self.body!r}")


@dataclass(frozen=True, slots=True, init=False)
class RecipientRecord:
    """A recipient read back from a queue file; ``offset`` is its R type byte."""

    address: str
    offset: int
    orcpt: str | None = None
    notify: frozenset[str] = frozenset()

    def __init__(
        self,
        address: str,
        offset: int,
        orcpt: str | None = None,
        notify: frozenset[str] = _NO_NOTIFY,
    ) -> None:
        """The fields, in order (see ``_setters``)."""
        _RR_ADDRESS(self, address)
        _RR_OFFSET(self, offset)
        _RR_ORCPT(self, orcpt)
        _RR_NOTIFY(self, notify)


_RR_ADDRESS, _RR_OFFSET, _RR_ORCPT, _RR_NOTIFY = _setters(
    RecipientRecord, "address offset orcpt notify"
)


def _encode_recipient(rcpt: RecipientSpec) -> bytes:
    if rcpt.orcpt is None and not rcpt.notify:  # no DSN parameters: flags 0, the address
        return encode_record(REC_RCPT, b"\x00" + _enc(rcpt.address))
    flags = 0
    for word in rcpt.notify:
        flags |= _NOTIFY_BITS[word]
    parts = [b""]
    if rcpt.orcpt is not None:
        flags |= _HAS_ORCPT
        orcpt = _enc(rcpt.orcpt)
        parts.append(encode_varint(len(orcpt)) + orcpt)
    parts[0] = bytes((flags,))
    parts.append(_enc(rcpt.address))
    return encode_record(REC_RCPT, b"".join(parts))


def _decode_recipient(payload: bytes, offset: int) -> RecipientRecord:
    if not payload:
        raise SpoolError(f"empty recipient record at offset {offset}")
    flags = payload[0]
    pos = 1
    orcpt: str | None = None
    if flags & _HAS_ORCPT:
        length, pos = _decode_varint(payload, pos, offset)
        if pos + length > len(payload):
            raise SpoolError(f"recipient record at offset {offset}: ORCPT overruns the record")
        orcpt = _dec(payload[pos : pos + length])
        pos += length
    notify = frozenset(w for w, bit in _NOTIFY_BITS.items() if flags & bit)
    return RecipientRecord(_dec(payload[pos:]), offset, orcpt, notify)


def _decode_varint(data: bytes, pos: int, where: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise SpoolError(f"bad length field in record at offset {where}")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def encode_queue_file(envelope: Envelope, content_size: int) -> tuple[bytes, bytes]:
    """Everything except the content: (head up to the content payload, tail after it).

    The file is ``head + content + tail``; the writer can hand the three parts
    to one ``writev`` without copying the content.
    """
    recs: list[bytes] = []
    sec, usec = divmod(round(envelope.arrival_time * 1e6), 1_000_000)
    recs.append(encode_record(REC_TIME, f"{sec} {usec}".encode()))
    recs.append(encode_record(REC_SENDER, _enc(envelope.sender)))
    attrs: dict[str, str | None] = {
        "envid": envelope.envid,
        "ret": envelope.ret,
        "smtputf8": "1" if envelope.smtputf8 else None,
        "body": envelope.body,
        "client_name": envelope.client_name,
        "client_addr": envelope.client_addr,
        "helo": envelope.helo,
        "sasl_username": envelope.sasl_username,
    }
    for name, value in attrs.items():
        if value is not None:
            recs.append(encode_record(REC_ATTR, _enc(f"{name}={value}")))
    if envelope.warn_time is not None:
        recs.append(encode_record(REC_WARN, b"%15d" % envelope.warn_time))
    recs.extend(_encode_recipient(r) for r in envelope.recipients)
    body = b"".join(recs)
    content_marker = bytes((REC_CONTENT,)) + encode_varint(content_size)
    content_offset = 2 + _SIZE_PAYLOAD_LEN + len(body) + len(content_marker)
    size = (_SIZE_FORMAT % (content_size, content_offset, len(envelope.recipients), 0)).encode()
    head = encode_record(REC_SIZE, size) + body + content_marker
    return head, encode_record(REC_END, b"")


class _Stream:
    """Sequential record reader over a file, from a byte offset, with its own buffer."""

    __slots__ = ("_buf", "_file", "_pos", "_size", "_start", "path")

    def __init__(self, file: BinaryIO, offset: int, path: Path, size: int) -> None:
        self._file = file
        self._buf = b""
        self._start = offset  # file offset of _buf[0]
        self._pos = 0
        self._size = size  # the file size: no record may claim more than what is left
        self.path = path
        file.seek(offset)

    def tell(self) -> int:
        return self._start + self._pos

    def _fill(self, need: int) -> bool:
        """Make ``need`` bytes available at _pos; False at end of file."""
        avail = len(self._buf) - self._pos
        if avail >= need:
            return True
        more = self._file.read(max(_READ_CHUNK, need - avail))
        self._start += self._pos
        self._buf = self._buf[self._pos :] + more
        self._pos = 0
        return len(self._buf) >= need

    def header(self) -> tuple[int, int, int]:
        """(record offset, type, payload length) of the next record."""
        offset = self.tell()
        if not self._fill(2):
            raise SpoolError(f"{self.path}: truncated at offset {offset}")
        rtype = self._buf[self._pos]
        self._pos += 1
        value = 0
        shift = 0
        while True:
            if not self._fill(1):
                raise SpoolError(f"{self.path}: truncated length at offset {offset}")
            byte = self._buf[self._pos]
            self._pos += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return offset, rtype, value
            if shift > 63:
                raise SpoolError(f"{self.path}: bad length field at offset {offset}")

    def _check(self, length: int) -> None:
        if self.tell() + length > self._size:
            raise SpoolError(f"{self.path}: record overruns the file at offset {self.tell()}")

    def payload(self, length: int) -> bytes:
        self._check(length)
        if not self._fill(length):
            raise SpoolError(f"{self.path}: record overruns the file at offset {self.tell()}")
        data = self._buf[self._pos : self._pos + length]
        self._pos += length
        return data

    def skip(self, length: int) -> None:
        self._check(length)
        avail = len(self._buf) - self._pos
        if length <= avail:
            self._pos += length
            return
        self._start += self._pos + length
        self._buf = b""
        self._pos = 0
        self._file.seek(self._start)


def _int_field(text: str, what: str, path: Path) -> int:
    try:
        return int(text)
    except ValueError:
        raise SpoolError(f"{path}: bad {what} {text!r}") from None
