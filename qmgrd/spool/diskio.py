"""The queue-file writer's disk helpers: whole writes, padding records, copies, directory fsync.

Moved out of ``qmgrd.spool.writer`` (its module docstring says how they are
used). Everything here blocks on the disk and runs in a worker thread, except
where the writer's docstring says otherwise; nothing keeps state.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool.records import REC_DONE
from qmgrd.spool.store import Spool

COPY_CHUNK = 256 * 1024  # REDIRECT after a flush: content copied this much at a time


def sync_directories(
    spool: Spool, committed: Sequence[tuple[str, str]], dirs: QueueDirectories | None = None
) -> SpoolError | None:
    """Fsync each target directory of ``committed`` (target, queue id) pairs once.

    With ``dirs`` the directories' descriptors are its own, opened once (no
    open and close per batch). On failure every committed file is unlinked
    (none was acknowledged, so none may stay where the queue manager would
    find it) and the error is returned.
    """
    if not committed or not spool.fsync:
        return None
    try:
        for target in sorted({t for t, _ in committed}):
            if dirs is not None:
                dirs.sync(target)
                continue
            fd = os.open(f"{spool.root}/{target}", os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    except OSError as exc:
        for target, queue_id in committed:
            with contextlib.suppress(OSError):
                os.unlink(f"{spool.root}/{target}/{queue_id}")
        return SpoolError(f"queue directory sync error: {exc.strerror or exc}")
    return None


class QueueDirectories:
    """Open descriptors of queue directories, for the group commit's directory fsyncs.

    Each directory is opened on first use and kept open until ``close``
    (thread-safe: the committer's flights share it). A failed fsync keeps the
    descriptor: the next batch fsyncs the same directory again.
    """

    __slots__ = ("_fds", "_lock", "root")

    def __init__(self, root: str) -> None:
        self.root = root
        self._fds: dict[str, int] = {}
        self._lock = threading.Lock()

    def sync(self, target: str) -> None:
        """Fsync ``root/target``; OSError if it fails."""
        fd = self._fds.get(target)
        if fd is None:
            with self._lock:
                fd = self._fds.get(target)
                if fd is None:
                    fd = os.open(f"{self.root}/{target}", os.O_RDONLY | os.O_DIRECTORY)
                    self._fds[target] = fd
        os.fsync(fd)

    def close(self) -> None:
        """Close every descriptor (idempotent)."""
        with self._lock:
            fds, self._fds = self._fds, {}
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _padding(length: int) -> bytes:
    """A D record of exactly ``length`` bytes (3..11): flags 0 and a NUL address."""
    if not 3 <= length <= 129:
        raise InvariantError(f"padding of {length} bytes")
    return bytes((REC_DONE, length - 2, 0)) + bytes(length - 3)


def _copy(src: int, dst: int, offset: int, length: int) -> None:
    """Append ``length`` bytes of ``src`` from ``offset`` to ``dst``, COPY_CHUNK at a time."""
    while length > 0:
        chunk = os.pread(src, min(COPY_CHUNK, length), offset)
        if not chunk:
            raise OSError(f"queue file shorter than written ({length} bytes missing)")
        _write_all(dst, chunk)
        offset += len(chunk)
        length -= len(chunk)


def _write_all(fd: int, data: bytearray | bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written == 0:
            raise OSError(f"write returned 0 with {len(view)} bytes left")
        view = view[written:]


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        if written == 0:
            raise OSError(f"pwrite returned 0 with {len(view)} bytes left")
        view = view[written:]
        offset += written
