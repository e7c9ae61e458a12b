"""The queue-file reader and the in-place writes (the format: ``recformat``).

The record layout, its encoding and the record stream live in
``qmgrd.spool.recformat``; every name there is importable from here too
(re-exported in ``__all__``).

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
from qmgrd.spool.recformat import (
    _ATTR_NAMES,
    _HAS_ORCPT,
    _NOTIFY_BITS,
    _READ_CHUNK,
    _SIZE_FORMAT,
    _SIZE_PAYLOAD_LEN,
    _WARN_PAYLOAD_LEN,
    NOTIFY_KEYWORDS,
    REC_ATTR,
    REC_CONTENT,
    REC_DONE,
    REC_END,
    REC_RCPT,
    REC_SENDER,
    REC_SIZE,
    REC_TIME,
    REC_WARN,
    WARNED,
    Envelope,
    RecipientRecord,
    RecipientSpec,
    _dec,
    _decode_recipient,
    _decode_varint,
    _enc,
    _encode_recipient,
    _int_field,
    _Stream,
    encode_queue_file,
    encode_record,
    encode_varint,
)

__all__ = [  # the format's names too: importers and tests use this module
    "NOTIFY_KEYWORDS", "REC_ATTR", "REC_CONTENT", "REC_DONE", "REC_END", "REC_RCPT", "REC_SENDER",
    "REC_SIZE", "REC_TIME", "REC_WARN", "WARNED", "_ATTR_NAMES", "_HAS_ORCPT", "_MARK_SPAN",
    "_NOTIFY_BITS", "_OPEN_FLAGS", "_READ_CHUNK", "_SIZE_FORMAT", "_SIZE_PAYLOAD_LEN",
    "_WARN_PAYLOAD_LEN", "Envelope", "QueueFile", "QueueFileIOError", "RecipientRecord",
    "RecipientSpec", "_Stream", "_dec", "_decode_recipient", "_decode_varint", "_enc",
    "_encode_recipient", "_int_field", "_reader", "encode_queue_file", "encode_record",
    "encode_varint", "mark_done", "open_regular", "open_regular_stat", "read_recipients",
    "recipients_from", "rewrite_warn_time",
]



class QueueFileIOError(SpoolError):
    """The system, not the file, failed: EMFILE, ENFILE, ENOMEM, EIO, EACCES, ENOENT ...

    Raised where an ``OSError`` interrupted a read or an in-place write. The
    file's content is not known to be bad, so it must not be quarantined:
    leave it where it is (or move it back) and retry later. Every other
    ``SpoolError`` from this module means the file itself is unusable
    (``corrupt/``).
    """

_MARK_SPAN = 65536  # bytes of recipient records ``mark_done`` checks with one read
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_regular(path: Path, flags: int, mode: int = 0o600) -> int:
    """Open a queue file without following a symlink; SpoolError unless it is a regular file.

    ``O_NONBLOCK`` makes opening a FIFO return at once instead of waiting for a
    writer; it has no effect on regular files. Other OSErrors (EACCES, EMFILE)
    propagate for the caller to wrap. With ``O_CREAT`` a new file gets ``mode``.
    """
    return open_regular_stat(path, flags, mode)[0]


def open_regular_stat(
    path: Path | str, flags: int, mode: int = 0o600
) -> tuple[int, os.stat_result]:
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
