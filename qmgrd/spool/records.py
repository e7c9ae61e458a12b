"""The queue-file record format: encoding, the reader, and the in-place writes.

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

Invariants: offsets handed out by the reader always point at an R/D type
byte; the only in-place writes are R→D and the W payload.

Hostile files: every open uses ``O_NOFOLLOW | O_NONBLOCK`` and checks that the
result is a regular file, so a symlink, FIFO, device or directory planted in a
queue directory is refused (SpoolError) rather than followed, read forever or
blocked on. Every length field is checked against the file size before any
buffer is allocated, so a damaged length cannot ask for gigabytes.

Errors: a file that cannot be parsed raises ``SpoolError`` (quarantine it);
an ``OSError`` on the way (too many open files, an I/O error, a permission)
raises its subclass ``QueueFileIOError``: the file may be fine, retry later.
"""

from __future__ import annotations

import errno
import io
import os
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qmgrd.errors import InvariantError, SpoolError


class QueueFileIOError(SpoolError):
    """The system, not the file, failed: EMFILE, ENFILE, ENOMEM, EIO, EACCES, ENOENT ...

    Raised where an ``OSError`` interrupted a read or an in-place write. The
    file's content is not known to be bad, so it must not be quarantined:
    leave it where it is (or move it back) and retry later. Every other
    ``SpoolError`` from this module means the file itself is unusable
    (``corrupt/``).
    """

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
_MARK_SPAN = 65536  # bytes of recipient records ``mark_done`` checks with one read
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a queue file without following a symlink; SpoolError unless it is a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a
    writer; it has no effect on regular files. Other OSErrors (EACCES, EMFILE)
    propagate for the caller to wrap. With ``O_CREAT`` a new file gets ``mode``.
    """
    return open_regular_stat(path, flags, mode)[0]


def open_regular_stat(path: Path, flags: int, mode: int = 0o600) -> tuple[int, os.stat_result]:
    """``open_regular``, and the descriptor's ``fstat`` (size and mode without another call)."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpoolError(f"{path}: is a symbolic link, not a queue file") from None
        raise
    try:
        st = os.fstat(fd)
    except OSError:
        os.close(fd)
        raise
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SpoolError(f"{path}: not a regular file")
    return fd, st


@contextmanager
def _reader(path: Path) -> Iterator[tuple[BinaryIO, int]]:
    """The queue file opened for reading, and its size.

    A file of at most one read chunk (most mail) is read whole by one
    ``pread`` (a short read is the end of the file) and closed at once:
    open, fstat, pread, close, where a buffered file object adds an fstat for
    the size, another in its constructor, an isatty probe and seeks. Every
    system call in a worker thread gives the interpreter lock away and takes
    it back, so fewer calls are fewer thread switches. A larger file is read
    through a buffered file object (memory stays bounded by the chunk).
    """
    fd = open_regular(path, os.O_RDONLY)
    try:
        data = os.pread(fd, _READ_CHUNK + 1, 0)
    except BaseException:
        os.close(fd)
        raise
    if len(data) <= _READ_CHUNK:
        os.close(fd)
        yield io.BytesIO(data), len(data)
        return
    with os.fdopen(fd, "rb") as f:
        yield f, os.fstat(fd).st_size


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _dec(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def encode_varint(value: int) -> bytes:
    """Little-endian base-128 encoding of a non-negative int."""
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
    return bytes((rtype,)) + encode_varint(len(payload)) + payload


@dataclass(frozen=True, slots=True)
class RecipientSpec:
    """A recipient as accepted at intake, with its DSN parameters (RFC 3461)."""

    address: str
    orcpt: str | None = None  # "addr-type;xtext" as given, e.g. "rfc822;a@b"
    notify: frozenset[str] = frozenset()  # subset of NOTIFY_KEYWORDS; empty = not given

    def __post_init__(self) -> None:
        unknown = self.notify - _NOTIFY_BITS.keys()
        if unknown:
            raise InvariantError(f"unknown NOTIFY keywords {sorted(unknown)}")
        if "NEVER" in self.notify and len(self.notify) > 1:
            raise InvariantError("NOTIFY=NEVER combined with other keywords")


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


@dataclass(frozen=True, slots=True)
class RecipientRecord:
    """A recipient read back from a queue file; ``offset`` is its R type byte."""

    address: str
    offset: int
    orcpt: str | None = None
    notify: frozenset[str] = frozenset()


def _encode_recipient(rcpt: RecipientSpec) -> bytes:
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


@dataclass(frozen=True, slots=True)
class QueueFile:
    """The envelope of a queue file, read without its recipients or content.

    Use ``read_recipients`` to page through recipients and ``content_offset`` /
    ``content_size`` (or ``qmgrd.spool.content``) to stream the content.
    """

    path: Path
    sender: str
    arrival_time: float
    rcpt_count: int  # recipients written at intake (done ones included)
    content_offset: int
    content_size: int
    first_recipient_offset: int
    flags: int = 0
    envid: str | None = None
    ret: str | None = None
    smtputf8: bool = False
    body: str | None = None
    client_name: str | None = None
    client_addr: str | None = None
    helo: str | None = None
    sasl_username: str | None = None  # absent in files written before the record existed
    warn_time: int | None = None
    warn_offset: int | None = None  # offset of the W record, for rewrite_warn_time

    @property
    def queue_id(self) -> str:
        return self.path.name

    @classmethod
    def open(cls, path: Path) -> QueueFile:
        """Parse the envelope; raises SpoolError naming the reason if the file is unusable."""
        try:
            with _reader(path) as (f, size):
                return cls.parse(f, path, size)
        except OSError as exc:
            raise QueueFileIOError(f"{path}: cannot read queue file: {exc.strerror}") from exc

    @classmethod
    def parse(cls, f: BinaryIO, path: Path, file_size: int) -> QueueFile:
        """The envelope of the queue file ``path`` open as ``f`` (``file_size`` bytes)."""
        stream = _Stream(f, 0, path, file_size)
        _, rtype, length = stream.header()
        if rtype != REC_SIZE or length != _SIZE_PAYLOAD_LEN:
            raise SpoolError(f"{path}: no size record at the start")
        fields = _dec(stream.payload(length)).split()
        if len(fields) != 4:
            raise SpoolError(f"{path}: malformed size record")
        content_size, content_offset, rcpt_count, flags = (
            _int_field(x, "size record field", path) for x in fields
        )
        if min(content_size, content_offset, rcpt_count, flags) < 0:
            raise SpoolError(f"{path}: negative field in the size record")
        if content_offset + content_size + 2 != file_size:
            raise SpoolError(
                f"{path}: size {file_size} does not match the size record "
                f"(incomplete or damaged file)"
            )
        arrival: float | None = None
        sender: str | None = None
        attrs: dict[str, str] = {}
        warn_time: int | None = None
        warn_offset: int | None = None
        while True:
            offset, rtype, length = stream.header()
            if rtype in (REC_RCPT, REC_DONE, REC_CONTENT):
                break
            payload = stream.payload(length)
            if rtype == REC_TIME:
                parts = _dec(payload).split()
                if len(parts) != 2:
                    raise SpoolError(f"{path}: malformed arrival time record")
                sec, usec = (_int_field(x, "arrival time", path) for x in parts)
                arrival = sec + usec / 1e6
            elif rtype == REC_SENDER:
                sender = _dec(payload)
            elif rtype == REC_ATTR:
                name, eq, value = _dec(payload).partition("=")
                if not eq:
                    raise SpoolError(f"{path}: malformed attribute record at offset {offset}")
                attrs[name] = value
            elif rtype == REC_WARN:
                warn_time = _int_field(_dec(payload), "warning time", path)
                warn_offset = offset
            else:
                raise SpoolError(f"{path}: unexpected record type {rtype:#x} at offset {offset}")
        first_recipient = offset
        if arrival is None or sender is None:
            raise SpoolError(f"{path}: missing arrival time or sender record")
        # The content record must sit where the size record says, followed by E;
        # checked directly so that opening never walks the recipient records.
        marker = bytes((REC_CONTENT,)) + encode_varint(content_size)
        if content_offset - len(marker) < stream.tell():
            raise SpoolError(f"{path}: content record disagrees with the size record")
        f.seek(content_offset - len(marker))
        if f.read(len(marker)) != marker:
            raise SpoolError(f"{path}: content record disagrees with the size record")
        f.seek(content_offset + content_size)
        if f.read(2) != b"E\x00":
            raise SpoolError(f"{path}: no end record")
        return cls(
            path=path,
            sender=sender,
            arrival_time=arrival,
            rcpt_count=rcpt_count,
            content_offset=content_offset,
            content_size=content_size,
            first_recipient_offset=first_recipient,
            flags=flags,
            envid=attrs.get("envid"),
            ret=attrs.get("ret"),
            smtputf8=attrs.get("smtputf8") == "1",
            body=attrs.get("body"),
            client_name=attrs.get("client_name"),
            client_addr=attrs.get("client_addr"),
            helo=attrs.get("helo"),
            sasl_username=attrs.get("sasl_username"),
            warn_time=warn_time,
            warn_offset=warn_offset,
        )

    def read_recipients(self, offset: int, limit: int) -> tuple[list[RecipientRecord], int]:
        """Up to ``limit`` not-done recipients from ``offset`` and the offset to resume from.

        The resume offset is 0 when every recipient has been read. Done (D)
        records are skipped. Memory is bounded by ``limit``, not by the file.
        """
        return read_recipients(self.path, offset, limit)

    def read_all_recipients(self) -> list[RecipientRecord]:
        """Every not-done recipient (for small messages, tools and tests only)."""
        out: list[RecipientRecord] = []
        offset = self.first_recipient_offset
        while offset:
            batch, offset = self.read_recipients(offset, 5000)
            out.extend(batch)
        return out


def read_recipients(path: Path, offset: int, limit: int) -> tuple[list[RecipientRecord], int]:
    """See ``QueueFile.read_recipients``; ``offset`` must be an R/D record offset."""
    if limit < 1:
        raise InvariantError(f"read_recipients limit {limit} < 1")
    if offset <= 0:
        raise InvariantError(f"read_recipients offset {offset} is not a recipient offset")
    try:
        with _reader(path) as (f, size):
            return recipients_from(f, size, path, offset, limit)
    except OSError as exc:
        raise QueueFileIOError(f"{path}: cannot read queue file: {exc.strerror}") from exc


def recipients_from(
    f: BinaryIO, size: int, path: Path, offset: int, limit: int
) -> tuple[list[RecipientRecord], int]:
    """``read_recipients`` over the queue file ``path`` already open as ``f`` (``size`` bytes)."""
    out: list[RecipientRecord] = []
    stream = _Stream(f, offset, path, size)
    while True:
        rec_offset, rtype, length = stream.header()
        if rtype == REC_RCPT:
            if len(out) == limit:
                return out, rec_offset
            out.append(_decode_recipient(stream.payload(length), rec_offset))
        elif rtype == REC_DONE:
            stream.skip(length)
        elif rtype == REC_CONTENT:
            return out, 0
        else:
            raise SpoolError(f"{path}: unexpected record type {rtype:#x} at offset {rec_offset}")


def mark_done(path: Path, offsets: Iterable[int], *, fsync: bool = True) -> None:
    """Overwrite each recipient's type byte R → D: one open, one fsync.

    An offset that does not hold an R or D is a bug in the caller
    (InvariantError); marking a done recipient again is harmless. The type
    bytes are checked with one read per ``_MARK_SPAN`` bytes of file that the
    offsets span (a delivery's recipients are near each other), and only the
    type bytes are written: other recipients' marks, written at the same time
    by another delivery of the message, are never overwritten.
    """
    try:
        fd = open_regular(path, os.O_RDWR)
    except OSError as exc:
        raise QueueFileIOError(
            f"{path}: cannot open queue file for update: {exc.strerror}"
        ) from exc
    try:
        todo = sorted(offsets)
        i = 0
        while i < len(todo):
            base = todo[i]
            j = i
            while j + 1 < len(todo) and todo[j + 1] - base < _MARK_SPAN:
                j += 1
            window = os.pread(fd, todo[j] - base + 1, base)
            for offset in todo[i : j + 1]:
                current = window[offset - base : offset - base + 1]
                if current == b"R":
                    os.pwrite(fd, b"D", offset)
                elif current != b"D":
                    raise InvariantError(f"{path}: offset {offset} is not a recipient record")
            i = j + 1
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        raise QueueFileIOError(f"{path}: cannot update queue file: {exc.strerror}") from exc
    finally:
        os.close(fd)


def rewrite_warn_time(path: Path, warn_offset: int, value: int, *, fsync: bool = True) -> None:
    """Rewrite the W record at ``warn_offset`` in place (``WARNED`` after the warning)."""
    try:
        fd = open_regular(path, os.O_RDWR)
    except OSError as exc:
        raise QueueFileIOError(
            f"{path}: cannot open queue file for update: {exc.strerror}"
        ) from exc
    try:
        if os.pread(fd, 2, warn_offset) != bytes((REC_WARN, _WARN_PAYLOAD_LEN)):
            raise InvariantError(f"{path}: offset {warn_offset} is not a W record")
        os.pwrite(fd, b"%15d" % value, warn_offset + 2)
        if fsync:
            os.fsync(fd)
    except OSError as exc:
        raise QueueFileIOError(f"{path}: cannot update queue file: {exc.strerror}") from exc
    finally:
        os.close(fd)
