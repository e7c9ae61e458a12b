"""A finished queue file into a free name of the recycle pool: probe, never replace one in use.

Why
---
``recycle.retire`` names a pooled file by its queue id's hash. When that name
is taken, a plain ``rename`` replaces it and frees the older file's inode, as
an unlink would. While the pool holds few files the listener workers claim
them as fast as they come, so a taken name is frequent and each one costs a
new inode later: measured on the standard benchmark (2 listener workers, 1 KB,
``bench/warmup.py --perf ext4:ext4_allocate_inode``) 167-244 inode allocations
per 3,000 messages in the workers, each walking the block group's recently
deleted inodes (``recycle``'s module doc), and as many inodes freed (with a
discard) by the queue manager.

Contract
--------
``place(path, directory, first)`` renames ``path`` to ``directory/NN`` for
the first ``NN`` (two hex digits, ``first``, ``first + 1``, ... modulo
``slots``, at most ``PROBES`` names) that does not exist, atomically
(``renameat2`` with ``RENAME_NOREPLACE``: two processes never both get a
name). When every probed name is taken the pool is full and ``path`` replaces
``directory/first`` as before (its inode freed: the pool stays bounded).
Errors are ``rename``'s: ``FileNotFoundError`` when ``path`` or ``directory``
is missing, ``OSError`` otherwise. Where ``renameat2`` is not available (not
Linux, an old C library, a file system that refuses the flag) it is a plain
``rename`` to ``first``.

``prefill(directory, count)`` (``qmgrd run``, once the daemon has started and
before it says so: off the path of any message) makes ``directory`` (mode 0700) if
needed and creates an empty file (mode 0600) under each of the names ``00``
to ``count - 1`` that does not exist, so that a fresh spool's first messages
claim pooled files instead of allocating inodes under load (measured: the
first 3,000 messages of a fresh spool allocated 141 inodes, later loads 6).
It returns how many it made; it stops at the first error other than a name
already taken (the pool is an optimisation: the writer creates files when it
is empty).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sys

__all__ = ["PREFILL", "PROBES", "place", "prefill"]

PROBES = 8  # names tried before the pool counts as full
PREFILL = 128  # pooled files a fresh spool gets at start-up (half of recycle.SLOTS)
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
_FS_ENCODING = sys.getfilesystemencoding()  # os.fsencode's, without its call per name
_FS_ERRORS = sys.getfilesystemencodeerrors()


def _renameat2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return None
    # No argtypes: ``place`` passes only ints (small, non-negative flag) and
    # bytes, which ctypes converts natively to int and char *; declared
    # argtypes cost a from_param call per argument on every call (measured:
    # callgrind, bench/intakepath.py). restype stays the default, c_int.
    fn.restype = ctypes.c_int
    return fn


class _NoReplace:
    """``renameat2(..., RENAME_NOREPLACE)``, or None after the system refused it once."""

    __slots__ = ("fn",)

    def __init__(self) -> None:
        self.fn = _renameat2()


_NOREPLACE = _NoReplace()


def place(path: str, directory: str, first: int, slots: int) -> None:
    """Rename ``path`` into a free name of ``directory`` (see the module doc)."""
    fn = _NOREPLACE.fn
    if fn is not None:
        source = path.encode(_FS_ENCODING, _FS_ERRORS)
        pool = directory.encode(_FS_ENCODING, _FS_ERRORS)
        for i in range(PROBES):
            target = b"%s/%02x" % (pool, (first + i) % slots)
            if fn(_AT_FDCWD, source, _AT_FDCWD, target, _RENAME_NOREPLACE) == 0:
                return
            err = ctypes.get_errno()
            if err == errno.EEXIST:
                continue
            if err in (errno.EINVAL, errno.ENOSYS):  # no RENAME_NOREPLACE here
                _NOREPLACE.fn = None
                break
            raise OSError(err, os.strerror(err), path)
    os.rename(path, f"{directory}/{first % slots:02x}")


def prefill(directory: str, count: int) -> int:
    """Create the missing pooled files ``00`` .. ``count - 1`` (see the module doc)."""
    made = 0
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)
        for n in range(count):
            try:
                fd = os.open(f"{directory}/{n:02x}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                continue
            os.close(fd)
            made += 1
    except OSError:
        pass
    return made
