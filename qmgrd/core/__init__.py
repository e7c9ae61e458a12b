"""The pure scheduler core: Postfix nqmgr without I/O (DESIGN §5, notes §2-§8).

The engine uses :class:`Scheduler` (see :mod:`qmgrd.core.scheduler` for the full contract):

    sched = Scheduler(SchedulerParams(...), transport_params)   # name -> TransportParams
    msg = sched.message_create(qid, queued_time=now, rcpt_unread=n)
    for req in sched.pop_reads():          # read up to req.limit recipients from req.offset
        sched.recipients_add(req.message, resolved, next_offset, now)
    while (entry := sched.select(now)) is not None:
        start a delivery of entry (entry.transport, entry.nexthop, entry.recipients, entry.cache_*)
    sched.entry_done(entry, hop_failure=None | (dsn, reason), crashed=False, now=now)
    for event in sched.pop_events(): ...   # MessageDone, RecipientsDeferred, Destination*, ...
    sleep until sched.next_deadline(); sched.run_timers(now)

Nothing in this package reads files, awaits, sleeps or reads the clock; it imports nothing of the
project except :mod:`qmgrd.errors`.
"""

from qmgrd.core.entry import Entry, EntryState
from qmgrd.core.events import (
    DestinationDead,
    DestinationRevived,
    Event,
    MessageDone,
    RecipientsDeferred,
    TransportDead,
    TransportRevived,
)
from qmgrd.core.message import Message, ReadRequest, ResolvedRecipient
from qmgrd.core.params import READ_BATCH_LIMIT, SchedulerParams, TransportParams
from qmgrd.core.queue import Queue
from qmgrd.core.scheduler import Scheduler
from qmgrd.core.transport import Transport

__all__ = [
    "READ_BATCH_LIMIT",
    "DestinationDead",
    "DestinationRevived",
    "Entry",
    "EntryState",
    "Event",
    "Message",
    "MessageDone",
    "Queue",
    "ReadRequest",
    "RecipientsDeferred",
    "ResolvedRecipient",
    "Scheduler",
    "SchedulerParams",
    "Transport",
    "TransportDead",
    "TransportParams",
    "TransportRevived",
]
