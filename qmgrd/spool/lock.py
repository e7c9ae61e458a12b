"""The spool lock: one daemon per queue directory (Postfix's ``pid/master.pid``).

Theory of operation
-------------------
``qmgrd run`` takes an exclusive ``flock`` on ``pid/master.pid`` before it
changes anything in the spool (before recovery moves ``active/`` files back
to ``incoming/``, before directories are created or tightened) and holds it
for its whole life. The kernel drops the lock when the process dies, even by
kill -9, so a stale pid file never blocks a restart. The daemon writes its
pid into the file (Postfix's format: right-aligned in 10 columns, then a
newline), so a second daemon that finds the lock taken refuses with a
message that names the holder, having changed nothing.

Offline operator commands (``qmgrd hold|release|delete|requeue`` when no
daemon answers on the control socket) take the lock *shared*: several may
run at once, none while a daemon runs (``DaemonHoldsSpool``: go through the
control socket instead), and a daemon that starts meanwhile waits for them
(up to ``wait`` seconds) instead of recovering under their feet.

``flock`` rather than ``fcntl``/``lockf`` record locks: those belong to the
process and vanish when *any* descriptor of the file is closed, and are not
inherited the way we want. The descriptor is ``O_CLOEXEC``, so delivery
helpers never inherit the lock.

flock has no timeout, so the daemon's wait for offline commands is a short
bounded retry loop (start-up only, never on the event loop).

API
---
``lock_spool(root, *, wait=10.0, sleep=time.sleep) -> SpoolLock`` (daemon; exclusive).
``lock_spool_shared(root) -> SpoolLock`` (offline commands; shared).
``SpoolLock.release()`` / ``with SpoolLock``; ``read_holder_pid(root)``.
``SpoolBusy`` (a ``SpoolError``) when the lock is held, with ``pid`` of the
daemon holding it when known; ``DaemonHoldsSpool`` is its subclass for the
shared lock refused because a daemon runs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from qmgrd.errors import SpoolError
from qmgrd.spool.safety import check_directory, describe_uid

__all__ = [
    "LOCK_FILE",
    "DaemonHoldsSpool",
    "SpoolBusy",
    "SpoolLock",
    "lock_spool",
    "lock_spool_shared",
    "read_holder_pid",
]

LOCK_FILE = Path("pid") / "master.pid"
_RETRY = 0.05  # seconds between attempts while offline commands hold the lock
_PID_BYTES = 64


class SpoolBusy(SpoolError):
    """The spool lock is held by someone else (``pid``: the daemon holding it, if known)."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


class DaemonHoldsSpool(SpoolBusy):
    """A shared lock was refused: a daemon runs on this spool (use its control socket)."""


class SpoolLock:
    """A held spool lock; ``release()`` (or leaving the ``with`` block) gives it up."""

    __slots__ = ("_fd", "exclusive", "path")

    def __init__(self, fd: int | None, path: Path, *, exclusive: bool) -> None:
        self._fd = fd
        self.path = path
        self.exclusive = exclusive

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (idempotent). The pid file itself stays, as Postfix's does."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the only descriptor releases the flock

    def __enter__(self) -> SpoolLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def read_holder_pid(root: Path) -> int | None:
    """The pid written in ``pid/master.pid``, or None (no file, empty, not a number)."""
    try:
        fd = os.open(root / LOCK_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _PID_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        pid = int(data.strip() or b"x")
    except ValueError:
        return None
    return pid if pid > 0 else None


def _open_lock_file(path: Path, *, require_uid: int | None) -> int:
    """Open (creating if needed) the lock file: a regular file, never through a symlink.

    ``require_uid``: the file must belong to that user (the daemon). None (an
    offline command): any owner will do, but a file that root owns in a spool
    of another user is handed to that user, who must open it at the next start.
    """
    try:
        fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600
        )
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SpoolError(f"unsafe spool lock file {path}: it is a symbolic link") from None
        raise SpoolError(f"cannot open spool lock file {path}: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpoolError(f"unsafe spool lock file {path}: not a regular file")
        if require_uid is not None and st.st_uid != require_uid:
            raise SpoolError(
                f"unsafe spool lock file {path}: owned by {describe_uid(st.st_uid)}, "
                f"not by the daemon's user {describe_uid(require_uid)}"
            )
        if require_uid is None and st.st_uid == 0:
            owner = os.stat(path.parent, follow_symlinks=False)
            if owner.st_uid != 0:
                os.fchown(fd, owner.st_uid, owner.st_gid)
    except OSError as exc:
        os.close(fd)
        raise SpoolError(f"cannot prepare spool lock file {path}: {exc.strerror}") from exc
    except BaseException:
        os.close(fd)
        raise
    return fd


def _try(fd: int, operation: int) -> bool:
    """One non-blocking flock attempt: True if it was granted."""
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK):
            return False
        raise SpoolError(f"cannot lock the spool: {exc.strerror}") from exc
    return True


def _daemon_busy(root: Path) -> SpoolBusy:
    pid = read_holder_pid(root)
    who = f"pid {pid}" if pid is not None else "a process whose pid is unknown"
    return SpoolBusy(
        f"the queue directory {root} is in use by another qmgrd daemon ({who}, "
        f"lock file {root / LOCK_FILE})",
        pid,
    )


def lock_spool(
    root: Path, *, wait: float = 10.0, sleep: Callable[[float], None] = time.sleep
) -> SpoolLock:
    """Take the daemon's exclusive lock; SpoolBusy if another daemon holds the spool.

    Before the lock, only what the lock needs is looked at: ``queue_directory``
    and ``pid/`` are checked like every spool directory (``safety``: owner,
    mode, symlink) without changing their modes, and created only if
    missing. On success the file holds this process's pid.
    """
    uid = os.geteuid()
    check_directory(root, uid=uid, tighten=False, is_root=True)
    check_directory(root / "pid", uid=uid, tighten=False)
    path = root / LOCK_FILE
    fd = _open_lock_file(path, require_uid=uid)
    try:
        deadline = time.monotonic() + wait
        while not _try(fd, fcntl.LOCK_EX):
            # Held. By a daemon (exclusive) or by offline commands (shared)? Only the
            # latter lets a shared lock through; give it up at once and wait for them.
            if not _try(fd, fcntl.LOCK_SH):
                raise _daemon_busy(root)
            fcntl.flock(fd, fcntl.LOCK_UN)
            if time.monotonic() >= deadline:
                raise SpoolBusy(
                    f"the queue directory {root} is locked by offline qmgrd commands "
                    f"(hold, release, delete or requeue) for more than {wait:g}s"
                )
            sleep(_RETRY)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid():>10}\n".encode("ascii"), 0)
    except BaseException:
        os.close(fd)
        raise
    return SpoolLock(fd, path, exclusive=True)


def lock_spool_shared(root: Path) -> SpoolLock:
    """Take a shared lock for an offline command; DaemonHoldsSpool if a daemon runs.

    A spool that does not exist yet needs no lock (there is nothing to change
    in it): an unheld ``SpoolLock`` is returned. When run as root on a spool
    owned by the daemon's user, a lock file it creates is given to that user.
    """
    if not os.path.lexists(root):
        return SpoolLock(None, root / LOCK_FILE, exclusive=False)
    pid_dir = root / "pid"
    if not os.path.lexists(pid_dir):
        try:
            with contextlib.suppress(FileExistsError):
                os.mkdir(pid_dir, 0o700)
                st = os.stat(root)
                if st.st_uid != os.geteuid():
                    os.chown(pid_dir, st.st_uid, st.st_gid, follow_symlinks=False)
        except OSError as exc:
            raise SpoolError(f"cannot create {pid_dir}: {exc.strerror}") from exc
    path = root / LOCK_FILE
    fd = _open_lock_file(path, require_uid=None)
    try:
        if not _try(fd, fcntl.LOCK_SH):
            busy = _daemon_busy(root)
            raise DaemonHoldsSpool(str(busy), busy.pid)
    except BaseException:
        os.close(fd)
        raise
    return SpoolLock(fd, path, exclusive=False)

