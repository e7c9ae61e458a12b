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
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from qmgrd.spool.records import (
    QueueFile,
    QueueFileIOError,
    RecipientRecord,
    open_regular_stat,
    recipients_from,
)

__all__ = ["LoadedFile", "load_queue_file"]

_WHOLE = 256 * 1024  # a file this small (or up to ``keep``) is read with one pread


@dataclass(frozen=True, slots=True)
class LoadedFile:
    """What one read of a queue file gives the load (see the module doc)."""

    qf: QueueFile
    mode: int  # st_mode of the file opened (the forced-expire mark)
    recipients: list[RecipientRecord] | Exception  # the first read's records, or its failure
    next_offset: int  # where the next read resumes (0: all read; 0 after a failure)
    content: bytes | None  # the content when at most ``keep`` bytes


def _first_recipients(
    f: BinaryIO, size: int, qf: QueueFile, limit: int
) -> tuple[list[RecipientRecord] | Exception, int]:
    try:
        return recipients_from(f, size, qf.path, qf.first_recipient_offset, limit)
    except OSError as exc:  # as read_recipients raises it
        return QueueFileIOError(f"{qf.path}: cannot read queue file: {exc.strerror}"), 0
    except Exception as exc:  # kept: the read request it answers raises it (module doc)
        return exc, 0


def load_queue_file(path: Path, rcpt_limit: int, keep: int = 0) -> LoadedFile:
    """Envelope, mode, first recipients and (small) content of ``path`` (module doc)."""
    try:
        fd, st = open_regular_stat(path, os.O_RDONLY)
        try:
            whole = max(_WHOLE, keep)
            # A buffer of the file's size (+1 sees a file that grew since the fstat: it is
            # read as a big one): a bigger one costs more than the read itself (256 KiB is
            # mmap'ed and faulted in at every load).
            data = os.pread(fd, st.st_size + 1, 0) if st.st_size <= whole else b""
            if data and len(data) <= st.st_size:
                os.close(fd)
                fd = -1
                f = io.BytesIO(data)
                qf = QueueFile.parse(f, path, len(data))
                recipients, next_offset = _first_recipients(f, len(data), qf, rcpt_limit)
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
