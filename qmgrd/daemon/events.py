"""Scheduler events: what the engine does with each event the pure core reports.

Contract
--------
``apply_events(ctx, now, finish=..., retired=..., defer_unattempted=...)`` drains
``scheduler.pop_events()`` once, on the loop, in order:

- ``MessageDone``: the message (IN_CORE in the table) moves to FINISHING and
  ``finish(record)`` is spawned (``qmgrd.daemon.finishing``); a message whose
  last delivery's file job removed its file already (FINISHING since that job,
  ``qmgrd.daemon.outcomes``) is only reported: ``retired(record)``, no task;
- ``RecipientsDeferred``: recipients at a destination that died get their
  defer reason and log line (``Recorder.defer_unattempted``);
- ``DestinationDead``: also handed to the destination gate (cluster: shared);
- ``DestinationDead`` / ``DestinationRevived`` / ``TransportDead`` /
  ``TransportRevived``: one ``qmgr`` log line each (Postfix logs the same
  state changes).

A ``MessageDone`` for a message the table does not hold is a bug
(``InvariantError``).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from qmgrd.core.events import (
    DestinationDead,
    DestinationRevived,
    MessageDone,
    RecipientsDeferred,
    TransportDead,
    TransportRevived,
)
from qmgrd.core.message import ResolvedRecipient
from qmgrd.daemon.context import EngineContext
from qmgrd.daemon.table import ActiveMessage, MessageState, Tracked, active_of
from qmgrd.errors import InvariantError

__all__ = ["apply_events"]

DeferUnattempted = Callable[[ActiveMessage, Sequence[ResolvedRecipient], str, str, float], None]


def apply_events(
    ctx: EngineContext,
    now: float,
    *,
    finish: Callable[[Tracked], Coroutine[Any, Any, None]],
    retired: Callable[[Tracked], None],
    defer_unattempted: DeferUnattempted,
) -> None:
    """Act on every pending scheduler event (see the module doc)."""
    log = ctx.log
    for event in ctx.scheduler.pop_events():
        if isinstance(event, MessageDone):
            record = ctx.table.find(event.message.queue_id)
            if record is None:
                raise InvariantError(f"{event.message.queue_id}: done but not in the table")
            msg = active_of(event.message)
            if not msg.early:  # else FINISHING since its last delivery's file job
                ctx.table.move(record, MessageState.FINISHING)
            if msg.retired:
                retired(record)
            else:
                ctx.spawn(finish(record))
        elif isinstance(event, RecipientsDeferred):
            msg = active_of(event.message)
            defer_unattempted(msg, event.recipients, event.status, event.reason, now)
        elif isinstance(event, DestinationDead):
            if ctx.gate is not None:
                ctx.gate.observe(event)  # cluster: publish this node's verdict
            log.warning(
                "destination dead",
                transport=event.transport,
                nexthop=event.nexthop,
                status=event.status,
                reason=event.reason,
            )
        elif isinstance(event, DestinationRevived):
            log.info("destination revived", transport=event.transport, queue=event.queue_name)
        elif isinstance(event, TransportDead):
            log.warning(
                "transport dead", transport=event.transport, status=event.status,
                reason=event.reason,
            )
        elif isinstance(event, TransportRevived):
            log.info("transport revived", transport=event.transport)
