"""The file side of operator operations, shared by the daemon and the offline commands.

Contract
--------
Blocking file work: call it from a worker thread in the daemon. Every
function takes the ``Spool`` and raises ``SpoolError``/``OSError`` when the
disk refuses; none of them logs.

``operate_file(spool, op, queue_id, sources, now) -> str`` applies ``op`` to a
message waiting in one of ``sources`` (the first queue holding it): ``hold``
moves it to ``hold/``, ``release`` to ``deferred/`` due now, ``requeue`` to
``incoming/`` due now, ``expire`` sets the forced-expire mark
(``qmgrd.spool.mark_forced_expire``; the file stays where it is, a deferred one
is made due now so the queue manager returns it at its next scan; a held one
stays held, as in Postfix), ``delete`` removes it from every one of ``sources``
(a hold made durable during a delivery leaves two names) with its ``defer/``
and ``bounce/`` logs. It answers ``ok``, ``not found`` or ``error: TEXT``; a file
that another process moved meanwhile is looked for in the next queue. The
daemon passes the queues it does not own a message in (never ``active/``);
the offline ``qmgrd hold|...`` passes ``op.sources``.

A message being delivered (in ``active/``, in core) cannot be moved under its
deliveries, so the daemon makes the operator's word durable at once and
finishes the job when the pass ends:

- ``mark_in_core(spool, op, queue_id)``: ``delete`` marks every remaining
  recipient done in the queue file itself (the same R -> D mark a delivery
  makes) and removes the reason logs, so a restart finds nothing to deliver;
  ``hold`` hard-links the file into ``hold/`` (the same inode: done marks made
  by the deliveries in flight show in the held file), so a restart finds it
  held. ``requeue`` needs nothing on disk: a restart requeues every active
  message anyway. A later delete or requeue replaces a hold (the link goes,
  ``unhold_in_core``).
- ``settle_in_core(spool, op, queue_id, now)``: when the pass ends, removes
  the ``active/`` name (hold, delete) or moves it to ``incoming/`` (requeue).
- ``recover_held(spool) -> int``: at start-up, before ``active/`` is
  recovered, drops the ``active/`` name of every message that is also in
  ``hold/`` as the same file (a hold made durable, then a crash).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from qmgrd.errors import SpoolError
from qmgrd.ops.operation import Operation, OpResult
from qmgrd.spool import QueueFile, Spool, mark_done, mark_forced_expire

__all__ = [
    "expire_file",
    "mark_in_core",
    "operate_file",
    "recover_held",
    "settle_in_core",
    "unhold_in_core",
]


def operate_file(
    spool: Spool, op: Operation, queue_id: str, sources: Sequence[str], now: float
) -> str:
    """Apply ``op`` to ``queue_id`` found in one of ``sources`` (see the module doc)."""
    if op is Operation.DELETE:
        return _delete_everywhere(spool, queue_id, sources)
    for src in sources:
        path = spool.path(src, queue_id)
        if not path.is_file():
            continue
        if op is Operation.HOLD and src == "hold":
            return OpResult.OK
        try:
            if op is Operation.EXPIRE:
                expire_file(path, due=now if src == "deferred" else None)
            elif op is Operation.HOLD:
                spool.move(queue_id, src, "hold")
            elif op is Operation.RELEASE:
                spool.move(queue_id, src, "deferred", mtime=now)
            else:
                spool.move(queue_id, src, "incoming", mtime=now)
        except FileNotFoundError:
            continue  # moved by someone else meanwhile: look in the next queue
        except SpoolError as exc:
            if not path.exists():
                continue  # moved by someone else meanwhile: look in the next queue
            return OpResult.error(str(exc))
        return OpResult.OK
    return OpResult.NOT_FOUND


def expire_file(path: Path, *, due: float | None = None) -> None:
    """Set the forced-expire mark on the queue file at ``path``; with ``due``, also make it
    due at that time (its mtime, as for a deferred message). FileNotFoundError if it is gone."""
    mark_forced_expire(path)
    if due is not None:
        try:
            os.utime(path, (due, due), follow_symlinks=False)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise SpoolError(f"cannot touch {path}: {exc.strerror}") from exc


def _delete_everywhere(spool: Spool, queue_id: str, sources: Sequence[str]) -> str:
    """Remove every name of ``queue_id`` in ``sources`` (a held link included) and its logs."""
    removed = False
    try:
        for src in sources:
            removed = spool.remove(src, queue_id) or removed
        if removed:
            remove_reasons(spool, queue_id)
    except SpoolError as exc:
        return OpResult.error(str(exc))
    return OpResult.OK if removed else OpResult.NOT_FOUND


def remove_reasons(spool: Spool, queue_id: str) -> None:
    """Remove the message's ``defer/`` and ``bounce/`` logs (a deleted message has none)."""
    spool.remove_reasons("defer", queue_id)
    spool.remove_reasons("bounce", queue_id)


def mark_in_core(spool: Spool, op: Operation, queue_id: str) -> None:
    """Make ``op`` on a message being delivered durable now (see the module doc)."""
    active = spool.path("active", queue_id)
    if op is not Operation.HOLD:
        unhold_in_core(spool, queue_id)  # held first, then something else: the hold goes
    if op is Operation.DELETE:
        qf = QueueFile.open(active)
        offsets = [r.offset for r in qf.read_all_recipients()]
        if offsets:
            mark_done(active, offsets)
        remove_reasons(spool, queue_id)
    elif op is Operation.HOLD:
        held = spool.path("hold", queue_id)
        try:
            os.link(active, held)
        except FileExistsError:
            if not _same_file(active, held):
                raise SpoolError(f"cannot hold {queue_id}: hold/{queue_id} exists") from None
        except OSError as exc:
            raise SpoolError(f"cannot hold {queue_id}: {exc.strerror}") from exc
        if spool.fsync:
            _fsync_dir(held.parent)


def unhold_in_core(spool: Spool, queue_id: str) -> bool:
    """Undo a durable hold of a message being delivered (its ``hold/`` link); whether one was."""
    active, held = spool.path("active", queue_id), spool.path("hold", queue_id)
    if not _same_file(active, held):
        return False
    spool.remove("hold", queue_id)
    if spool.fsync:
        _fsync_dir(held.parent)
    return True


def settle_in_core(spool: Spool, op: Operation, queue_id: str, now: float) -> None:
    """The end of the pass of a message marked with ``op`` (see the module doc)."""
    if op is Operation.REQUEUE:
        spool.move(queue_id, "active", "incoming", mtime=now)
        return
    if op is Operation.HOLD and not _same_file(
        spool.path("active", queue_id), spool.path("hold", queue_id)
    ):
        spool.move(queue_id, "active", "hold")  # the link was not made: move it now
        return
    spool.remove("active", queue_id)
    if op is Operation.DELETE:
        remove_reasons(spool, queue_id)


def recover_held(spool: Spool) -> int:
    """Drop the ``active/`` name of messages also in ``hold/``; how many."""
    dropped = 0
    for queue_id in spool.list_ids("active"):
        if _same_file(spool.path("active", queue_id), spool.path("hold", queue_id)):
            spool.remove("active", queue_id)
            dropped += 1
    return dropped


def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.lstat(a), os.lstat(b)
    except FileNotFoundError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
