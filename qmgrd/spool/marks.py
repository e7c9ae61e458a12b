"""Marks kept in a queue file's permission bits: "forced to expire".

Postfix marks a message that ``postsuper -e``/``-f`` forced to expire by
setting the group-execute bit of its queue file (``MAIL_QUEUE_STAT_EXPIRE``
= ``S_IXGRP`` in mail_queue.h); showq reports it as ``forced_expire`` and
mailq shows ``#`` after the queue id. qmgrd uses the same bit, for the same
reasons: setting it is one ``fchmod`` that needs no rewrite of the file, it
survives moves between queues (a rename keeps the inode), and a scan can see
it from ``stat`` without opening the file. Queue files are created 0600, so
the bit is never set by accident, and it grants nothing (the group cannot
read the file).

Contract for the queue manager (``qmgrd expire``): ``mark_forced_expire``
sets the mark; the queue manager, on its next look at a marked message,
returns it to the sender as if ``maximal_queue_lifetime`` had passed.
Readers (``mailq``) use ``is_forced_expire`` on an ``lstat`` result.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from qmgrd.errors import SpoolError

__all__ = ["FORCED_EXPIRE_MODE", "is_forced_expire", "mark_forced_expire"]

FORCED_EXPIRE_MODE = stat.S_IXGRP


def is_forced_expire(st_mode: int) -> bool:
    """Whether a queue file with this ``st_mode`` is forced to expire."""
    return bool(st_mode & FORCED_EXPIRE_MODE)


def mark_forced_expire(path: Path) -> bool:
    """Set the mark on the queue file at ``path``; False if it was already set.

    Never follows a symlink. FileNotFoundError if the file is gone (moved or
    delivered meanwhile: the caller looks in the other queues); SpoolError if
    it is not a regular file or cannot be changed.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise SpoolError(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpoolError(f"cannot mark {path}: not a regular file")
        if is_forced_expire(st.st_mode):
            return False
        os.fchmod(fd, stat.S_IMODE(st.st_mode) | FORCED_EXPIRE_MODE)
        return True
    except OSError as exc:
        raise SpoolError(f"cannot mark {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
