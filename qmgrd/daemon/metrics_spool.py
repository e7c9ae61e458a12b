"""Spool state for the metrics endpoint: files per queue and the age of each queue's oldest message.

Contract
--------
``spool_queue_counts(root)`` counts the files of each queue in ``SPOOL_QUEUES`` (hashed
subdirectories included, temporaries skipped; a missing queue counts 0);
``spool_oldest_ages(spool, now)`` gives, per queue in ``AGE_QUEUES``, the seconds since its
oldest message was created, from the queue ids alone. Both block on directory I/O: the
metrics endpoint calls them in a worker thread. Re-exported by ``qmgrd.daemon.metrics``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from qmgrd.errors import SpoolError
from qmgrd.spool import Spool, queue_id_time

__all__ = ["AGE_QUEUES", "SPOOL_QUEUES", "spool_oldest_ages", "spool_queue_counts"]

SPOOL_QUEUES = ("incoming", "active", "deferred", "hold", "corrupt")
"""Queues reported by :func:`spool_queue_counts` (the ones holding messages)."""

AGE_QUEUES = ("incoming", "active", "deferred", "hold")
"""Queues whose oldest message's age is reported (corrupt/ holds no live mail)."""

def spool_queue_counts(root: Path, queues: Iterable[str] = SPOOL_QUEUES) -> dict[str, int]:
    """Files per spool queue (hashed subdirectories included, temporaries skipped).

    Blocking directory I/O: the metrics endpoint calls it in a worker thread.
    A queue directory that does not exist counts 0.
    """
    counts: dict[str, int] = {}
    for queue in queues:
        counts[queue] = _count_files(root / queue)
    return counts


def spool_oldest_ages(
    spool: Spool, now: float, queues: Iterable[str] = AGE_QUEUES
) -> dict[str, float]:
    """Seconds since the oldest message of each queue was created (0 for an empty queue).

    From the ids alone (``Spool.list_ids`` lists oldest first; ``queue_id_time``):
    one directory listing per queue, no file opened. Blocking: call it in a thread.
    """
    ages: dict[str, float] = {}
    for queue in queues:
        try:
            ids = spool.list_ids(queue)
        except (OSError, SpoolError):
            ids = []
        age = 0.0
        if ids:
            try:
                age = max(0.0, now - queue_id_time(ids[0], now))
            except ValueError:  # cannot happen for a listed id; an age of 0 is harmless
                age = 0.0
        ages[queue] = age
    return ages


def _count_files(directory: Path) -> int:
    total = 0
    try:
        with os.scandir(directory) as it:
            for entry in it:
                if entry.name.startswith("."):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    total += _count_files(Path(entry.path))
                else:
                    total += 1
    except FileNotFoundError:
        return 0
    return total
