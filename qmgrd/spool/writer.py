"""Writing one queue file while the message arrives: memory bounded by a small buffer.

Theory of operation
-------------------
The listener creates a ``QueueFileWriter`` at MAIL (the envelope head is
known then: sender, arrival time = MAIL time as in Postfix, DSN and client
attributes), adds each accepted recipient, then the content as DATA
arrives. Records are appended to an in-memory buffer; when it holds
``flush_size`` bytes the caller runs ``flush()`` in a worker thread, which
creates the temporary file ``incoming/.<id>`` on first use and appends the
buffer to it. A message that fits in the buffer (the common case) is never
flushed: ``commit()`` writes it in one go, byte for byte what
``records.encode_queue_file`` produces. So memory per message is bounded by
the buffer, not by the number of recipients or the size of the content.
Content pieces of ``_SMALL`` bytes or more (DATA's chunks as received) are
not copied into the buffer: they are kept as given, after it, and written
together with it by one ``writev``; once ``_MAX_PARTS`` pieces wait (a big
one followed by many small ones), they are joined into the buffer (one copy).

The record format (``qmgrd.spool.records``) puts two values that are only
known at the end before the data they describe:

- the size record ``C`` at offset 0 (content size and offset, recipient
  count) has a fixed width: a placeholder is written first and overwritten
  with ``pwrite`` at commit;
- the content record's length (``M`` + a varint of the content size) has a
  variable width. When content starts, ``GAP`` (13) bytes are reserved. At
  commit, if the gap is still in the buffer, the marker replaces it exactly
  (the file is then identical to a one-shot write). If it is already on
  disk, the gap is overwritten with a padding record and then the marker:
  the padding is a ``D`` record (a recipient that is done, flags 0, an
  address of 0 to 8 NUL bytes). Every reader already skips D
  records between the recipients and the content, so the file is valid
  for the existing reader without any change.

The queue id is drawn when the writer is created (MAIL time), so the
content may name it (cleanup's ``Received: ... id ID`` and ``Message-Id``):
``queue_id`` is the id the committed file gets. ``commit()`` then appends
the end record, fsyncs the file, links it to ``incoming/<id>`` (link never
replaces a file; only a clash with another process's file, which the
id generator makes practically impossible, picks a new id) and
unlinks the temporary name; ``commit_writers`` (``qmgrd.spool.commit``) does that for a batch and
fsyncs ``incoming/`` once, so a queue id is returned only once the message
is durable. A writer whose ``target`` is ``"hold"`` (header_checks HOLD) is
linked into ``hold/`` instead, with the same discipline (and a fsync of
``hold/``): a held message is never visible in ``incoming/``.

REDIRECT (``replace_recipients``) works for any size: while nothing was
flushed the buffer is rewritten; after a flush, ``commit()`` writes a new
temporary file (head, new recipients, the content copied from the old file
in ``diskio.COPY_CHUNK`` pieces) and renames it over the old one before finishing.

With a ``recycler`` (``qmgrd.spool.recycle``) the temporary file is a pooled
one when the pool has any (renamed to the temporary name, written from offset
0, cut to the written length in ``finish`` before the fsync), else a new one.

``discard()`` removes the temporary file: a refused, reset or aborted
transaction leaves nothing. Temporaries of a writer that died
are removed at start-up (``Spool.remove_temp_files``).

Threads: ``flush``, ``commit`` and ``discard`` block on the disk and are
called from a worker thread; the owner never touches the writer while one
of them runs. ``add_*`` (buffer appends) and ``release`` run on the loop.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import cast

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool.diskio import (
    _copy,
    _padding,
    _pwrite_all,
    _write_all,
    sync_directories,
)
from qmgrd.spool.head import EnvelopeHead
from qmgrd.spool.records import (
    REC_CONTENT,
    REC_END,
    REC_SIZE,
    RecipientSpec,
    _encode_recipient,  # the R record encoding, shared with one-shot writes
    encode_record,
    encode_varint,
)
from qmgrd.spool.recycle import Recycler
from qmgrd.spool.store import TEMP_PREFIX, QueueName, Spool
from qmgrd.spool.store import _write_all as _writev_all  # writev until all is written

__all__ = [
    "FLUSH_SIZE",
    "EnvelopeHead",
    "QueueFileWriter",
    "sync_directories",
]

GAP = 13  # reserved for padding + "M" + varint(content size): marker <= 10 bytes, padding >= 3
FLUSH_SIZE = 128 * 1024
_SIZE_RECORD_LEN = 65  # "C" + varint(63) + 63 bytes
_SIZE_FORMAT = b"%15d %15d %15d %15d"
_SMALL = 4096  # content pieces below this are copied into the buffer (a 1 KB message: one piece)
_MAX_PARTS = 64  # content pieces kept apart before they are joined (writev's list stays short)


class QueueFileWriter:
    """One queue file being written (see the module docstring)."""

    __slots__ = (
        "_buf",
        "_closed",
        "_fd",
        "_flushed",
        "_gap_at",
        "_linked",
        "_parts",
        "_parts_size",
        "_rcpt_at",
        "_recycler",
        "_reused",
        "_spool",
        "content_size",
        "flush_size",
        "queue_id",
        "rcpt_count",
        "redirect",
        "target",
    )

    def __init__(
        self,
        spool: Spool,
        head: EnvelopeHead,
        *,
        flush_size: int = FLUSH_SIZE,
        recycler: Recycler | None = None,
    ) -> None:
        self._spool = spool
        self._recycler = recycler  # pooled inodes for the temporary file (spool.recycle)
        self._reused = 0  # a pooled temporary file's old size: cut to length at finish
        self.flush_size = flush_size
        self._buf = bytearray(_SIZE_RECORD_LEN)  # the C placeholder, rewritten at commit
        self._buf += head.encode()
        self._rcpt_at = len(self._buf)  # where the recipient records start
        self._parts: list[bytes | memoryview] = []  # content chunks after _buf, as given (no copy)
        self._parts_size = 0
        self._flushed = 0  # bytes of the file already written (the buffer follows them)
        self._fd = -1
        self._gap_at = -1  # file offset of the reserved gap; -1 = no content yet
        self._closed = False
        self._linked: str | None = None  # publish(keep_open=True): the temporary name left
        self.queue_id: str = spool.new_queue_id()  # the committed file's id (module doc)
        self.rcpt_count = 0
        self.content_size = 0
        self.target: QueueName = "incoming"  # where commit() links the file ("hold": HOLD)
        self.redirect: bytes | None = None  # REDIRECT after a flush: recipients for commit()

    @property
    def needs_flush(self) -> bool:
        """The buffer is full: run ``flush()`` (in a thread) before adding more."""
        return len(self._buf) + self._parts_size >= self.flush_size

    @property
    def buffered(self) -> int:
        return len(self._buf) + self._parts_size

    def add_recipient(self, rcpt: RecipientSpec) -> None:
        if self._gap_at >= 0 or self._closed:
            raise InvariantError("add_recipient after the content started or after the end")
        self._buf += _encode_recipient(rcpt)
        self.rcpt_count += 1

    def begin_content(self) -> None:
        if self._gap_at >= 0 or self._closed or not self.rcpt_count:
            raise InvariantError("begin_content twice, after the end or without recipients")
        self._gap_at = self._flushed + len(self._buf)
        self._buf += bytes(GAP)

    def replace_recipients(self, rcpts: Sequence[RecipientSpec]) -> None:
        """Replace every recipient (cleanup's REDIRECT) before commit, for any size.

        While nothing was flushed the buffer is rewritten in place; otherwise
        ``commit()`` rebuilds the file with these recipients, copying the
        content already on disk in chunks (``_rebuild``): memory stays bounded.
        """
        if self._gap_at < 0 or self._closed or not rcpts:
            raise InvariantError("replace_recipients before the content, after the end or empty")
        new = b"".join(_encode_recipient(r) for r in rcpts)
        self.rcpt_count = len(rcpts)
        if self._flushed:
            self.redirect = new
            return
        self._buf[self._rcpt_at : self._gap_at] = new
        self._gap_at = self._rcpt_at + len(new)

    def add_content(self, data: bytes | memoryview) -> None:
        if self._gap_at < 0 or self._closed:
            raise InvariantError("add_content before begin_content or after the end")
        if self._parts or len(data) >= _SMALL:
            self._parts.append(data)  # written by writev as it is: no copy
            self._parts_size += len(data)
            if len(self._parts) >= _MAX_PARTS:  # many small pieces: one copy, bounded list
                self._buf += b"".join(self._parts)
                self._parts = []
                self._parts_size = 0
        else:
            self._buf += data
        self.content_size += len(data)

    # -- disk work (worker thread) -----------------------------------------------------

    def _temp(self) -> str:
        # Plain strings: a pathlib join costs more than the system call it names.
        return f"{self._spool.root}/incoming/{TEMP_PREFIX}{self.queue_id}"

    def _open(self) -> None:
        if self._fd < 0 and self._recycler is not None:
            claimed = self._recycler.claim(self._temp())
            if claimed is not None:
                self._fd, self._reused = claimed
        if self._fd < 0:
            # O_EXCL: ids never repeat within a generator, so EEXIST is an error to report.
            self._fd = os.open(
                self._temp(), os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600
            )

    def flush(self) -> None:
        """Append the buffer to the temporary file (created on first use); SpoolError if not."""
        if self._closed:
            raise InvariantError("flush after the end")
        try:
            self._open()
            self._write_buffered()
        except OSError as exc:
            self.discard()
            raise SpoolError(f"queue file write error: {exc.strerror or exc}") from exc

    def _write_buffered(self, tail: bytes = b"") -> None:
        """Append the buffer, the content chunks and ``tail`` with one writev; empty them."""
        # store's helper is typed for bytes; writev takes any buffer (the bytearray too)
        _writev_all(self._fd, cast("list[bytes]", [self._buf, *self._parts, tail]))
        self._flushed += len(self._buf) + self._parts_size + len(tail)
        self._buf = bytearray()
        self._parts = []
        self._parts_size = 0

    def _rebuild(self, rcpts: bytes) -> None:
        """REDIRECT after a flush: a new temporary file with ``rcpts`` replaces the old one.

        The C placeholder and envelope head are read back (small), the content
        already written is copied in ``diskio.COPY_CHUNK`` pieces; the new file is
        renamed over the old temporary name, so a crash leaves one of them.
        """
        self._open()
        self._write_buffered()
        content_at, end = self._gap_at + GAP, self._flushed
        head = os.pread(self._fd, self._rcpt_at, 0)
        if len(head) != self._rcpt_at:
            raise OSError(f"queue file shorter than written ({len(head)} of {self._rcpt_at})")
        head += rcpts
        temp = self._temp()
        fresh = temp + ".redirect"
        fd = os.open(fresh, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, head + bytes(GAP))
            _copy(self._fd, fd, content_at, end - content_at)
            os.rename(fresh, temp)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            raise
        os.close(self._fd)
        self._fd = fd
        self._reused = 0  # a new file of exactly the length written
        self._gap_at = len(head)
        self._flushed = len(head) + GAP + (end - content_at)
        self.redirect = None

    def commit(self) -> str:
        """Finish, fsync and link the file into its ``target`` queue (no directory fsync).

        Returns its id. ``target`` is incoming/, or hold/ for a message that
        header_checks HOLDs: it never appears in incoming/, so no queue scan
        can take it. The caller fsyncs the directory before announcing the id
        (``commit_writers``). SpoolError if anything fails; nothing is left
        behind then. The same as ``finish()``, ``sync()`` and ``publish()``
        in a row; a writer already finished goes on with ``sync()`` (the
        group committer runs ``finish`` on the loop, the rest in a thread).
        """
        if not self._closed:  # else ``finish`` ran already (on the loop: GroupCommitter)
            self.finish()
        self.sync()
        return self.publish()

    def finish(self) -> None:
        """Commit step 1: write what is left and the size record (page cache, no fsync).

        Small and cheap unless a REDIRECT after a flush rebuilds the file
        (``needs_rebuild``). SpoolError (nothing left behind) if it fails.
        """
        if self._gap_at < 0 or self._closed:
            raise InvariantError("commit without content or after the end")
        marker = bytes((REC_CONTENT,)) + encode_varint(self.content_size)
        try:
            if self.redirect is not None:
                self._rebuild(self.redirect)
            if self._gap_at >= self._flushed:  # the gap is still in the buffer: no padding
                at = self._gap_at - self._flushed
                self._buf[at : at + GAP] = marker
                content_offset = self._gap_at + len(marker)
                fixup = b""
            else:
                content_offset = self._gap_at + GAP
                fixup = _padding(GAP - len(marker)) + marker
            size = encode_record(
                REC_SIZE, _SIZE_FORMAT % (self.content_size, content_offset, self.rcpt_count, 0)
            )
            inline = self._flushed == 0  # the C placeholder is still in the buffer
            if inline:
                self._buf[:_SIZE_RECORD_LEN] = size
            self._open()
            self._write_buffered(encode_record(REC_END, b""))
            if fixup:
                _pwrite_all(self._fd, fixup, self._gap_at)
            if not inline:
                _pwrite_all(self._fd, size, 0)
            if self._reused > self._flushed:  # a pooled file: its old bytes past ours go
                os.ftruncate(self._fd, self._flushed)
        except OSError as exc:
            self.discard()
            raise SpoolError(f"queue file write error: {exc.strerror or exc}") from exc
        self._buf = bytearray()
        self._closed = True  # no more add_*/flush; sync and publish follow

    @property
    def needs_rebuild(self) -> bool:
        """``finish`` will copy the content to a new file (REDIRECT after a flush)."""
        return self.redirect is not None and self._flushed > 0

    def sync(self) -> None:
        """Commit step 2 (worker thread): fsync the file; SpoolError (nothing left) if not."""
        if self._fd < 0:
            raise InvariantError("sync before finish")
        try:
            if self._spool.fsync:
                os.fsync(self._fd)
        except OSError as exc:
            self.discard()
            raise SpoolError(f"queue file write error: {exc.strerror or exc}") from exc

    def publish(self, *, keep_open: bool = False) -> str:
        """Commit step 3: link into ``target``, then ``release`` unless ``keep_open``; the id.

        No directory fsync (the caller does it once per batch); SpoolError (nothing left
        behind) if it fails. A crash before ``release`` leaves a temporary name start-up removes.
        """
        if self._fd < 0:
            raise InvariantError("publish before finish")
        temp = self._temp()
        directory = f"{self._spool.root}/{self.target}"
        try:
            try:
                os.link(temp, f"{directory}/{self.queue_id}")
            except FileExistsError:  # a salt collision with another process: a new name
                self.queue_id = self._spool.new_queue_id()
                os.link(temp, f"{directory}/{self.queue_id}")
        except OSError as exc:
            self.discard()
            with contextlib.suppress(OSError):
                os.unlink(temp)
            raise SpoolError(f"queue file write error: {exc.strerror or exc}") from exc
        self._linked = temp
        if not keep_open:
            self.release()
        return self.queue_id

    def release(self) -> None:
        """Close the published file and unlink its temporary name; idempotent, never raises."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        if self._linked is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._linked)
            self._linked = None

    def discard(self) -> None:
        """Close and remove the temporary file, if any; idempotent, never raises."""
        self._closed = True
        self._buf = bytearray()
        self._parts = []
        self._parts_size = 0
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
            with contextlib.suppress(OSError):
                os.unlink(self._temp())
