"""Recycled queue files: finished messages' inodes reused for new temporary queue files.

Why
---
On ext4 without a journal (this project's benchmark disk) allocating an inode
skips every inode of the block group freed in the last one to six minutes
(``recently_deleted`` in the kernel's inode allocator), one look-up each: a
relay that creates and deletes a file per message fills its group with such
inodes, and each ``open(O_CREAT)`` then walks thousands of them (measured:
the temporary queue file's creation was 17 % of a listener worker under the
standard benchmark and half of ``bench/intakepath.py``'s CPU on ``/tmp``). A
file that is renamed instead of deleted keeps its inode, and reusing it costs
a rename and an open.

Contract
--------
- ``retire(root, queue, queue_id, size)`` (the queue manager, worker thread,
  instead of ``Spool.remove`` for a message that is done): renames the queue
  file to ``recycle/NN`` (``NN`` from the queue id's hash, ``SLOTS`` names, so
  the directory never holds more than ``SLOTS`` files; a name in use is
  replaced and its inode freed, as an unlink would). Files of more than
  ``MAX_SIZE`` bytes (``size``: the caller's count, the end of the content) are
  unlinked: the pool's disk use stays bounded. Returns False if the file was
  already gone, as ``Spool.remove``.
  ``recycle/`` is made on first use (mode 0700).
- ``Recycler(root).claim(temp)`` (the queue file writer): renames one pooled
  file to the writer's temporary name ``temp`` and returns ``(fd, size)``: an
  ``O_RDWR`` descriptor on it (mode reset to 0600: no mark in the mode bits
  survives) and its old size; None when the pool is empty (the writer then
  creates a file as before). A rename is atomic, so two processes never get
  the same file. A file with another name (``st_nlink`` > 1: a hold made while
  it was delivered links it into ``hold/``) is never reused: only the pool's
  name goes. The names come from one ``scandir`` of ``recycle/``, repeated
  when they are used up and the directory changed since (its mtime: one
  ``stat`` per claim while the pool is empty). The writer overwrites the file
  from offset 0 and cuts it to its own length before the fsync
  (``QueueFileWriter.finish``): the old content never survives a commit, and a
  crash before the commit leaves a temporary name that start-up removes.
- ``Recycler(root, part=i, parts=n)`` claims only the names whose number is
  ``i`` modulo ``n``: listener worker processes each take a part of their own
  (``retire`` spreads files over every name by the queue id's hash, so each
  part gets its share), so two of them never race for the same file (a lost
  race costs a failed rename; measured at 1.7 per message with two workers
  sharing every name).
- Nothing in ``recycle/`` is mail: no scan, tool or queue reads it; its files
  hold a finished message's bytes until they are reused or replaced (as
  Postfix's deleted queue files hold theirs until the blocks are reused).
"""

from __future__ import annotations

import contextlib
import os
import random
import stat
import zlib

from qmgrd.errors import InvariantError, SpoolError
from qmgrd.spool.poolslot import place

__all__ = ["MAX_SIZE", "RECYCLE_DIR", "SLOTS", "Recycler", "retire"]

RECYCLE_DIR = "recycle"
SLOTS = 256  # names in recycle/: at most this many pooled files
MAX_SIZE = 128 * 1024  # file bytes above which a finished file is unlinked, not pooled


def retire(root: str, queue: str, queue_id: str, size: int) -> bool:
    """Pool (or, if large, unlink) the done queue file ``queue/queue_id``; False if gone.

    SpoolError when the disk refuses (as ``Spool.remove``).
    """
    path = f"{root}/{queue}/{queue_id}"
    try:
        if size > MAX_SIZE:
            os.unlink(path)
            return True
        slot = zlib.crc32(queue_id.encode()) % SLOTS
        try:
            place(path, f"{root}/{RECYCLE_DIR}", slot, SLOTS)  # a free name (poolslot)
        except FileNotFoundError:
            if not os.path.lexists(path):
                raise
            with contextlib.suppress(FileExistsError):  # the first use: make recycle/
                os.mkdir(f"{root}/{RECYCLE_DIR}", 0o700)
            place(path, f"{root}/{RECYCLE_DIR}", slot, SLOTS)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise SpoolError(f"cannot remove {queue}/{queue_id}: {exc.strerror}") from exc
    return True


class Recycler:
    """The writer's side of the pool (see the module doc); one per process."""

    __slots__ = ("_names", "_offset", "_part", "_parts", "_seen", "directory")

    def __init__(self, root: str, *, part: int = 0, parts: int = 1) -> None:
        if not 0 <= part < parts:
            raise InvariantError(f"recycle part {part} of {parts}")
        self.directory = f"{root}/{RECYCLE_DIR}"
        self._part = part  # this process claims the names numbered part modulo parts
        self._parts = parts
        self._names: list[str] = []
        self._seen = -1  # recycle/'s mtime at the last scan
        self._offset = random.randrange(SLOTS)  # where this process starts in a scan

    def claim(self, temp: str) -> tuple[int, int] | None:
        """(descriptor, size) of a pooled file now named ``temp``; None if none (module doc).

        Tries the names left from the last scan, then (one scan at most) what the
        directory holds now: bounded by ``2 * SLOTS`` renames.
        """
        scanned = False
        while True:
            if not self._names:
                if scanned or not self._scan():
                    return None
                scanned = True
            try:
                name = self._names.pop()
            except IndexError:  # another thread took the last one
                return None
            try:
                os.rename(f"{self.directory}/{name}", temp)
            except FileNotFoundError:  # claimed by another writer (or replaced meanwhile)
                continue
            except OSError:
                return None
            fd = -1
            try:
                fd = os.open(temp, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
                st = os.fstat(fd)
                # Another name for the same file (a hold made during its delivery) keeps
                # it as mail: never reused. Only the temporary name goes.
                if st.st_nlink == 1 and stat.S_ISREG(st.st_mode):
                    if stat.S_IMODE(st.st_mode) != 0o600:  # a mark in the mode bits goes
                        os.fchmod(fd, 0o600)
                    return fd, st.st_size
            except OSError:
                pass
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temp)

    def _scan(self) -> bool:
        """Refill the names from ``recycle/``; False if there are none or it did not change."""
        try:
            changed = os.stat(self.directory).st_mtime_ns
            if changed == self._seen:  # nothing renamed in or out since the last scan
                return False
            self._seen = changed
            with os.scandir(self.directory) as it:
                names = [
                    e.name for e in it if self._mine(e.name) and e.is_file(follow_symlinks=False)
                ]
            # Every process lists the same names in the same order: each starts at a
            # place of its own, so that two of them rarely try the same name.
            cut = self._offset % len(names) if names else 0
            self._names = names[cut:] + names[:cut]
        except OSError:
            return False
        return bool(self._names)

    def _mine(self, name: str) -> bool:
        """Whether ``name`` is in this process's part of the pool (module doc)."""
        if self._parts == 1:
            return True
        try:
            return int(name, 16) % self._parts == self._part
        except ValueError:
            return False
