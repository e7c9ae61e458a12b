"""The queue manager's load of a queue file: one open, one read, one parse.

Contract
--------
``load_queue_file(path, rcpt_limit, keep)`` (a worker thread) returns a
:class:`LoadedFile`: the envelope (``QueueFile``), the file's mode (its
forced-expire mark, ``qmgrd.spool.marks``), the first ``rcpt_limit``
not-done recipients and where the next read resumes (exactly what
``QueueFile.read_recipients(first_recipient_offset, rcpt_limit)`` returns;
its failure is kept in ``recipients`` as the exception that read would
raise, so the read request it answers reports it as before), and the
message content itself when it is at most ``keep`` bytes (else None).

A file of at most ``max(256 KiB, keep)`` bytes costs open, fstat, one
``pread`` (into a buffer of the file's size) and close: the envelope, the
recipients and the content all come from that one buffer, kept or not (one
system call and one GIL hand-off instead of the buffered reader's read and
seek calls). A bigger file is read through a buffered file object on the
same descriptor (memory bounded by the read chunk; content not kept).
Errors are ``QueueFile.open``'s: an ``OSError`` (EMFILE, EIO, ...) raises
``QueueFileIOError`` (retry later), a file that cannot be parsed raises
``SpoolError`` (quarantine), a symlink or a non-regular file too.

A file read whole is parsed straight from its bytes (:func:`_envelope`,
:func:`_recipients`): the same checks as the record stream of
``recformat`` in one loop over the buffer, without a stream object, a method
call per record field or a generator per number. They only ever accept: any
record they do not take in their stride (a multi-byte length where one byte is
usual, an ORCPT, a check that fails, a number ``int`` refuses) makes them
return None, and the file is parsed again by ``QueueFile.parse`` /
``recipients_from``, which give the answer or raise the error, so a file
loads (or fails) exactly as it did through the stream.
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass, make_dataclass
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import BinaryIO

from qmgrd.errors import SpoolError
from qmgrd.spool.recformat import _setters
from qmgrd.spool.records import (
    _HAS_ORCPT,
    _NOTIFY_BITS,
    _SIZE_PAYLOAD_LEN,
    REC_ATTR,
    REC_CONTENT,
    REC_DONE,
    REC_RCPT,
    REC_SENDER,
    REC_SIZE,
    REC_TIME,
    REC_WARN,
    QueueFile,
    QueueFileIOError,
    RecipientRecord,
    _decode_recipient,
    _decode_varint,
    encode_varint,
    open_regular_stat,
    recipients_from,
)

__all__ = ["LoadedFile", "load_queue_file"]

_WHOLE = 256 * 1024  # a file this small (or up to ``keep``) is read with one pread


@dataclass(frozen=True, slots=True, init=False)
class LoadedFile:
    """What one read of a queue file gives the load (see the module doc)."""

    qf: QueueFile
    mode: int  # st_mode of the file opened (the forced-expire mark)
    recipients: list[RecipientRecord] | Exception  # the first read's records, or its failure
    next_offset: int  # where the next read resumes (0: all read; 0 after a failure)
    content: bytes | None  # the content when at most ``keep`` bytes

    def __init__(
        self,
        qf: QueueFile,
        mode: int,
        recipients: list[RecipientRecord] | Exception,
        next_offset: int,
        content: bytes | None,
    ) -> None:
        """The fields, in order, each slot set directly: one is built per load, and the
        generated ``__init__`` of a frozen dataclass pays an ``object.__setattr__`` per
        field (``recformat._setters``). Still frozen, with the generated ``==``/``hash``."""
        _L_QF(self, qf)
        _L_MODE(self, mode)
        _L_RECIPIENTS(self, recipients)
        _L_NEXT_OFFSET(self, next_offset)
        _L_CONTENT(self, content)


_L_QF, _L_MODE, _L_RECIPIENTS, _L_NEXT_OFFSET, _L_CONTENT = _setters(
    LoadedFile, "qf mode recipients next_offset content"
)


# The NOTIFY keywords of a recipient's flags byte (bits 0-3), as _decode_recipient builds them.
_NOTIFY_SETS = tuple(
    frozenset(w for w, bit in _NOTIFY_BITS.items() if flags & bit) for flags in range(16)
)
_FIRST = 2 + _SIZE_PAYLOAD_LEN  # offset of the record after the size record

# ``QueueFile`` is a frozen dataclass of 18 fields, built once per load: its generated
# ``__init__`` pays an ``object.__setattr__`` per field (~26K instructions, callgrind).
# ``_envelope`` fills this mutable twin instead, made from QueueFile's own fields (the same
# slots on the same base: CPython lets an instance of one take the other's class), then
# makes it a QueueFile by one ``__class__`` assignment (~6K in all): the very object
# ``QueueFile(...)`` would build (its type, ==, hash, repr; frozen).
# tests/unit/spool/test_record_types.py pins the twin to the class.
_QueueFileTwin = make_dataclass(
    "_QueueFileTwin", [f.name for f in dataclass_fields(QueueFile)], slots=True
)
_SET_CLASS = object.__setattr__


def _header(data: bytes, pos: int) -> tuple[int, int] | None:
    """(payload length, payload offset) of the record at ``pos``; None where the stream's
    ``header`` would fail (or a length field it reads differently)."""
    if pos + 2 > len(data):
        return None
    try:  # the varint rule every reader of the format shares (at most 10 bytes)
        return _decode_varint(data, pos + 1, pos)
    except SpoolError:
        return None


def _envelope(data: bytes, path: Path) -> QueueFile | None:
    """``QueueFile.parse`` of the whole file ``data``; None: let it parse (module doc)."""
    size = len(data)
    if size < _FIRST or data[0] != REC_SIZE or data[1] != _SIZE_PAYLOAD_LEN:
        return None
    fields = data[2:_FIRST].decode("utf-8", "surrogateescape").split()
    if len(fields) != 4:
        return None
    try:
        content_size, content_offset, rcpt_count, flags = map(int, fields)
        arrival: float | None = None
        sender: str | None = None
        attrs: dict[str, str] = {}
        warn_time: int | None = None
        warn_offset: int | None = None
        if (
            min(content_size, content_offset, rcpt_count, flags) < 0
            or content_offset + content_size + 2 != size
        ):
            return None
        pos = _FIRST
        while True:
            if pos + 2 > size:
                return None
            rtype = data[pos]
            length = data[pos + 1]
            if length < 0x80:
                start = pos + 2
            else:
                header = _header(data, pos)
                if header is None:
                    return None
                length, start = header
            if rtype in (REC_RCPT, REC_DONE, REC_CONTENT):
                break
            end = start + length
            if end > size:
                return None
            if rtype == REC_TIME:
                parts = data[start:end].decode("utf-8", "surrogateescape").split()
                if len(parts) != 2:
                    return None
                arrival = int(parts[0]) + int(parts[1]) / 1e6
            elif rtype == REC_SENDER:
                sender = data[start:end].decode("utf-8", "surrogateescape")
            elif rtype == REC_ATTR:
                text = data[start:end].decode("utf-8", "surrogateescape")  # recformat._dec
                name, eq, value = text.partition("=")
                if not eq:
                    return None
                attrs[name] = value
            elif rtype == REC_WARN:
                warn_time = int(data[start:end].decode("utf-8", "surrogateescape"))
                warn_offset = pos
            else:
                return None
            pos = end
    except ValueError:  # a number int() refuses
        return None
    if arrival is None or sender is None:
        return None
    if content_size < 0x80:  # encode_varint, inlined for the usual sizes
        marker = bytes((REC_CONTENT, content_size))
    elif content_size < 0x4000:
        marker = bytes((REC_CONTENT, content_size & 0x7F | 0x80, content_size >> 7))
    else:
        marker = bytes((REC_CONTENT,)) + encode_varint(content_size)
    if (
        content_offset - len(marker) < start
        or data[content_offset - len(marker) : content_offset] != marker
        or data[size - 2 :] != b"E\x00"
    ):
        return None
    get = attrs.get
    qf = _QueueFileTwin(  # positional, in field order: keywords cost a third more here
        path,
        sender,
        arrival,
        rcpt_count,
        content_offset,
        content_size,
        pos,  # first_recipient_offset
        flags,
        get("envid"),
        get("ret"),
        get("smtputf8") == "1",
        get("body"),
        get("client_name"),
        get("client_addr"),
        get("helo"),
        get("sasl_username"),
        warn_time,
        warn_offset,
    )
    _SET_CLASS(qf, "__class__", QueueFile)  # now the QueueFile itself (_QueueFileTwin)
    built: QueueFile = qf
    return built


def _recipients(
    data: bytes, offset: int, limit: int
) -> tuple[list[RecipientRecord], int] | None:
    """``recipients_from`` over the whole file ``data``; None: let it read (module doc)."""
    size = len(data)
    out: list[RecipientRecord] = []
    pos = offset
    while True:
        if pos + 2 > size:
            return None
        rtype = data[pos]
        length = data[pos + 1]
        if length < 0x80:
            start = pos + 2
        elif pos + 2 < size and data[pos + 2] < 0x80:  # _header of a two-byte length, inlined
            length = length & 0x7F | data[pos + 2] << 7  # (the content record of 128 B-16 KiB)
            start = pos + 3
        else:
            header = _header(data, pos)
            if header is None:
                return None
            length, start = header
        end = start + length
        if rtype == REC_RCPT:
            if len(out) == limit:
                return out, pos
            if end > size or not length:
                return None
            flags = data[start]
            if flags & _HAS_ORCPT:
                try:
                    out.append(_decode_recipient(data[start:end], pos))
                except Exception:
                    return None
            else:
                address = data[start + 1 : end].decode("utf-8", "surrogateescape")
                out.append(RecipientRecord(address, pos, None, _NOTIFY_SETS[flags & 15]))
        elif rtype == REC_DONE:
            if end > size:
                return None
        elif rtype == REC_CONTENT:
            return out, 0
        else:
            return None
        pos = end


def _first_recipients(
    f: BinaryIO | None, size: int, qf: QueueFile, limit: int, data: bytes = b""
) -> tuple[list[RecipientRecord] | Exception, int]:
    """The first read's answer (``data``: the whole file, parsed from its bytes if it can;
    ``f`` None: a reader over ``data`` is made if the record stream must read it)."""
    try:
        if data:
            got = _recipients(data, qf.first_recipient_offset, limit)
            if got is not None:
                return got
        if f is None:
            f = io.BytesIO(data)
        return recipients_from(f, size, qf.path, qf.first_recipient_offset, limit)
    except OSError as exc:  # as read_recipients raises it
        return QueueFileIOError(f"{qf.path}: cannot read queue file: {exc.strerror}"), 0
    except Exception as exc:  # kept: the read request it answers raises it (module doc)
        return exc, 0


def load_queue_file(
    path: Path, rcpt_limit: int, keep: int = 0, name: str | None = None
) -> LoadedFile:
    """Envelope, mode, first recipients and (small) content of ``path`` (module doc);
    ``name``: ``str(path)``, when the caller has it (the open needs no conversion)."""
    try:
        fd, st = open_regular_stat(path if name is None else name, os.O_RDONLY)
        try:
            whole = max(_WHOLE, keep)
            # A buffer of the file's size (+1 sees a file that grew since the fstat: it is
            # read as a big one): a bigger one costs more than the read itself (256 KiB is
            # mmap'ed and faulted in at every load).
            data = os.pread(fd, st.st_size + 1, 0) if st.st_size <= whole else b""
            if data and len(data) <= st.st_size:
                os.close(fd)
                fd = -1
                f = None  # a reader over ``data`` only for the record stream (module doc)
                qf = _envelope(data, path)
                if qf is None:
                    f = io.BytesIO(data)
                    qf = QueueFile.parse(f, path, len(data))
                recipients, next_offset = _first_recipients(f, len(data), qf, rcpt_limit, data)
                end = qf.content_offset + qf.content_size
                content = data[qf.content_offset : end] if qf.content_size <= keep else None
                return LoadedFile(qf, st.st_mode, recipients, next_offset, content)
            with os.fdopen(fd, "rb") as big:
                fd = -1
                qf = QueueFile.parse(big, path, st.st_size)
                recipients, next_offset = _first_recipients(big, st.st_size, qf, rcpt_limit)
                return LoadedFile(qf, st.st_mode, recipients, next_offset, None)
        finally:
            if fd >= 0:
                os.close(fd)
    except OSError as exc:
        raise QueueFileIOError(f"{path}: cannot read queue file: {exc.strerror}") from exc
