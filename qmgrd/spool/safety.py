"""Trust checks on spool directories: owner, mode and symlinks (issue 9, item 6).

A queue file is trusted mail: whoever can put one in ``incoming/`` can send
anything, from any sender, with no relay check. So the daemon only uses a
spool that no other user can write to:

- every spool directory (``queue_directory`` and each of its subdirectories)
  must be a real directory owned by the daemon's effective user, checked with
  ``lstat``: a symlinked subdirectory is refused, never followed;
- none may be writable by its group or by others (``mode & 022``): another
  user could already have dropped a file, so tightening it now would be too
  late. The daemon refuses to start and says which directory and why;
- read or search access for others (e.g. 0755 from a loose umask) is only a
  privacy problem: the daemon owns the directory, so it sets 0700 and warns.

``queue_directory`` itself may be a symlink (spools are often moved to another
disk that way) when the link belongs to root or to the daemon's user; the
directory it points to gets the same checks. Its parent directories are the
installer's business, as in Postfix.

``check_directory(path, uid=..., create=..., tighten=...)`` does one
directory; it raises ``SpoolError`` with a one-line message naming the path.
``describe_uid(uid)`` renders ``uid 65534 (nobody)`` for such messages.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

from qmgrd.errors import SpoolError
from qmgrd.log import get_logger

__all__ = ["check_directory", "describe_uid"]

UNSAFE_BITS = 0o022  # group or other write
PRIVATE_MODE = 0o700


def describe_uid(uid: int) -> str:
    """``uid 1000 (qmgrd)``, or ``uid 1000`` when the user has no passwd entry."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _refuse(path: Path, why: str, fix: str) -> SpoolError:
    return SpoolError(f"unsafe spool directory {path}: {why}; refusing to use it ({fix})")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SpoolError(f"cannot inspect spool directory {path}: {exc.strerror}") from exc


def check_directory(
    path: Path, *, uid: int, create: bool = True, tighten: bool = True, is_root: bool = False
) -> None:
    """Make sure ``path`` is a spool directory only ``uid`` can change (see the module doc).

    ``create``: a missing directory is made with mode 0700 (parents too for
    the root); otherwise a missing directory is an error. ``tighten``: group
    or other read/search access is removed with a warning (False: left as
    is, for checks that must not change anything). ``is_root``: the path is
    ``queue_directory`` itself, which may be a trusted symlink.
    """
    st = _lstat(path)
    if st is None:
        if not create:
            raise SpoolError(f"spool directory {path} does not exist")
        try:
            if is_root:
                path.mkdir(mode=PRIVATE_MODE, parents=True, exist_ok=True)
            else:
                os.mkdir(path, PRIVATE_MODE)
        except FileExistsError:
            pass  # made meanwhile: checked below like any other
        except OSError as exc:
            raise SpoolError(f"cannot create spool directory {path}: {exc.strerror}") from exc
        st = _lstat(path)
        if st is None:
            raise SpoolError(f"spool directory {path} vanished while it was created")
    if stat.S_ISLNK(st.st_mode):
        if not is_root:
            raise _refuse(path, "it is a symbolic link", "make it a directory")
        if st.st_uid not in (0, uid):
            raise _refuse(
                path,
                f"it is a symbolic link owned by {describe_uid(st.st_uid)}",
                f"chown -h {_user_name(uid)} {path}",
            )
        try:
            st = os.stat(path)
        except OSError as exc:
            raise SpoolError(f"cannot follow {path}: {exc.strerror}") from exc
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(path, "not a directory", "move it away")
    if st.st_uid != uid:
        raise _refuse(
            path,
            f"owned by {describe_uid(st.st_uid)}, not by the daemon's user {describe_uid(uid)}",
            f"chown -R {_user_name(uid)} {path}, or run the daemon as its owner",
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & UNSAFE_BITS:
        who = "group- and world" if mode & 0o022 == 0o022 else (
            "group" if mode & 0o020 else "world"
        )
        raise _refuse(path, f"{who}-writable (mode {mode:04o})", f"chmod 0700 {path}")
    if tighten and mode & 0o077:
        try:
            os.chmod(path, PRIVATE_MODE)
        except OSError as exc:
            raise SpoolError(f"cannot set mode 0700 on {path}: {exc.strerror}") from exc
        get_logger("master").warning(
            "spool directory was open to other users; mode set to 0700",
            directory=str(path),
            old_mode=f"{mode:04o}",
        )
