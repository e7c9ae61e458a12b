"""Recovery at start-up: make the spool consistent before anything is delivered.

Contract (Postfix's ``qmgr_active_recover`` / the master's start-up)
---------------------------------------------------------------------
``recover(spool, now) -> Recovered`` runs in a worker thread, before the
listener accepts mail and before the first load:

1. missing spool directories are created;
2. temporary files of writers that died before their commit are removed
   (a live listener could otherwise lose a commit: hence "before accepting");
3. foreign entries (symlinks, FIFOs, stray names) go to ``corrupt/`` (logged
   by the spool);
4. an operator's hold made durable while the message was being delivered
   (the file linked into ``hold/``) is honoured: its ``active/`` name goes;
5. every other file in ``active/`` is moved back to ``incoming/`` (mtime
   now): its recipients not marked done are delivered again;
6. ``defer/`` and ``bounce/`` logs whose message is gone (a crash between
   the two unlinks) are removed.

It raises ``SpoolError`` when the spool cannot be used at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qmgrd.ops.spoolops import recover_held
from qmgrd.spool import Spool

__all__ = ["Recovered", "recover"]

_LIVE_QUEUES = ("incoming", "active", "deferred", "hold", "corrupt")


@dataclass(frozen=True, slots=True)
class Recovered:
    """What start-up recovery did (for the log)."""

    temporaries: int
    held: int
    moved: tuple[str, ...]
    orphan_logs: int

    def log(self, log: Any) -> None:
        """One ``qmgr`` line per kind of repair made."""
        if self.temporaries:
            log.info("removed unfinished queue files of an earlier run", count=self.temporaries)
        if self.orphan_logs:
            log.info("removed reason logs of messages no longer queued", count=self.orphan_logs)
        if self.held:
            log.info("kept messages the operator held during delivery", count=self.held)
        if self.moved:
            log.info("recovered messages from the active queue", count=len(self.moved))


def recover(spool: Spool, now: float) -> Recovered:
    """Steps 1-6 of the module doc (worker thread)."""
    spool.ensure_dirs()
    temps = spool.remove_temp_files()
    spool.sweep_foreign()  # symlinks, FIFOs, stray names -> corrupt/ (logged)
    held = recover_held(spool)
    moved = []
    for queue_id in spool.list_ids("active"):
        try:
            spool.move(queue_id, "active", "incoming", mtime=now)
            moved.append(queue_id)
        except FileNotFoundError:
            continue
    return Recovered(temps, held, tuple(moved), _remove_orphan_reasons(spool))


def _remove_orphan_reasons(spool: Spool) -> int:
    """Delete defer/bounce logs whose message is gone (a crash between the two unlinks)."""
    live: set[str] = set()
    for queue in _LIVE_QUEUES:
        live.update(spool.list_ids(queue))
    removed = 0
    for kind in ("defer", "bounce"):
        for queue_id in spool.list_ids(kind):
            if queue_id not in live and spool.remove_reasons(kind, queue_id):
                removed += 1
    return removed
