"""Start-up sweep of foreign entries out of the queue directories (``postsuper -s``).

Scans only return names that look like queue ids and never stat through a
symlink; :func:`sweep_foreign` moves whatever else sits in a queue directory
(stray names, symlinks, FIFOs, sub-directories, files owned by another user) to
``corrupt/`` with a warning, so it can neither be mistaken for mail nor make a
scan fail. ``Spool.sweep_foreign`` calls it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

from qmgrd.errors import SpoolError
from qmgrd.log import get_logger
from qmgrd.spool.queueid import is_queue_id
from qmgrd.spool.safety import describe_uid
from qmgrd.spool.store import LOG_DIRS, SWEPT_QUEUES, TEMP_PREFIX, QueueName, Spool


def sweep_foreign(
    spool: Spool, queues: Sequence[QueueName] = SWEPT_QUEUES, *, logs: bool = True
) -> int:
    """Move entries that are not plain queue files out of ``queues`` into corrupt/.

    Start-up only. Swept: names that are not queue ids (temporaries in
    incoming/ excepted: ``remove_temp_files`` owns them), symlinks (the
    link itself is moved, never its target), anything that is not a
    regular file, and queue files owned by another user than the daemon's
    (only root could have put them there: they are not the daemon's mail,
    and may be forged). Each gets a warning naming it; a name already
    taken in corrupt/ gets a numeric suffix. Returns how many were moved.

    ``logs``: also sweep defer/ and bounce/ of symlinks, directories,
    FIFOs and files of another owner (as ``corrupt/defer.ID``, never a
    queue file name): such an entry would make every load of its message
    fail, and wedge it. Stray regular files there are ignored by every
    reader and left alone.
    """
    moved = 0
    uid = os.geteuid()
    for queue in queues:
        for name, st in _lstat_entries(spool.root, queue):
            if queue == "incoming" and name.startswith(TEMP_PREFIX):
                continue
            why = _foreign_reason(st, uid) or (
                None if is_queue_id(name) else "not a queue file name"
            )
            if why is not None and _sweep_one(spool.root, queue, name, why):
                moved += 1
    for kind in LOG_DIRS if logs else ():
        for name, st in _lstat_entries(spool.root, kind):
            why = _foreign_reason(st, uid)
            if why is not None and _sweep_one(spool.root, kind, name, why, f"{kind}.{name}"):
                moved += 1
    return moved

def _lstat_entries(root: Path, queue: str) -> list[tuple[str, os.stat_result]]:
    directory = root / queue
    try:
        with os.scandir(directory) as it:
            entries = [(e.name, _entry_stat(e)) for e in it]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SpoolError(f"cannot list {directory}: {exc.strerror}") from exc
    return [(name, st) for name, st in entries if st is not None]

def _sweep_one(root: Path, queue: str, name: str, why: str, base: str | None = None) -> bool:
    log = get_logger("qmgr")
    corrupt = root / "corrupt"
    base = (base or name).lstrip(TEMP_PREFIX) or "_"
    target = corrupt / base
    for n in range(1, 1000):
        if not os.path.lexists(target):
            break
        target = corrupt / f"{base}~{n}"
    else:
        log.warning(
            "cannot quarantine foreign file",
            file=f"{queue}/{name}",
            reason=why,
            error="too many files of that name in corrupt/",
        )
        return False
    try:
        os.rename(root / queue / name, target)
    except OSError as exc:
        log.warning(
            "cannot quarantine foreign file",
            file=f"{queue}/{name}",
            reason=why,
            error=exc.strerror or str(exc),
        )
        return False
    log.warning(
        "foreign file in queue directory moved to corrupt",
        file=f"{queue}/{name}",
        reason=why,
        to=f"corrupt/{target.name}",
    )
    return True


def _foreign_reason(st: os.stat_result, uid: int) -> str | None:
    """Why an entry cannot be one of the daemon's files (None: it can)."""
    if stat.S_ISLNK(st.st_mode):
        return "symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_uid != uid:
        return f"owned by {describe_uid(st.st_uid)}, not by the daemon's user"
    return None


def _entry_stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    """The entry's lstat (never through a symlink); None if it vanished."""
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None
