"""The active-message table: every message the engine knows about, in exactly one state.

Contract
--------
Postfix's qmgr keeps a message's life in one structure (``QMGR_MESSAGE`` and
its flags); this table does the same for the engine. A queue id is in the
table from the moment the engine decides to load it until its file work is
over, and it is always in exactly one :class:`MessageState`:

=============  ==============================================================
WAITING        found in ``incoming/`` or due in ``deferred/``; not loaded yet
LOADING        being moved to ``active/`` and parsed (one file job in flight)
IN_CORE        registered with the scheduler; deliveries may run
FINISHING      the scheduler reported it done; its finish (notices, then
               remove / defer / expire / the operator's operation) runs;
               or its last delivery's file job removes it (``outcomes``)
RETRY          a finish failed (disk full, a bug in one step); the file stays
               in ``active/`` and the finish runs again at ``retry_at``
=============  ==============================================================

Allowed moves (anything else raises :class:`InvariantError` naming the state)::

    (absent) -> WAITING -> LOADING -> IN_CORE -> FINISHING -> (absent)
                WAITING -> (absent)            (an operator took it)
                           LOADING -> (absent) (vanished, corrupt, failed)
                                      FINISHING -> RETRY -> FINISHING

``create`` enters WAITING (or LOADING directly), ``move`` changes the state,
``done`` disposes of a message and ``find`` may return None. The waiting
messages are kept by :class:`~qmgrd.core.admission.Admission` (``admission``):
per flow in arrival order per source queue; ``next_waiting`` gives the next
one to load, fairly between flows and, inside the choice, alternating
incoming and deferred as Postfix does (with fairness ``none``: exactly
Postfix's order). A message taken by ``next_waiting`` counts against its
flow's limits until ``done``.
``settled(record)`` is an event set whenever the message is neither
LOADING nor FINISHING (operator operations wait on it, bounded); it is made
only when someone waits, so a big load queue costs no event per message.

An operator operation that arrives while a message is IN_CORE is kept on the
record (``op``); the finisher applies it when the message's pass ends.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from qmgrd.core.admission import Admission
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.core.message import Message, ResolvedRecipient
from qmgrd.errors import InvariantError
from qmgrd.ops.operation import Operation
from qmgrd.spool import QueueFile, ReasonRecord, RecipientRecord

__all__ = [
    "ActiveMessage",
    "MessageState",
    "MessageTable",
    "Source",
    "Tracked",
    "active_of",
    "record_of",
]


class MessageState(enum.Enum):
    """Where a known message is in its pass (see the module doc)."""

    WAITING = "waiting"
    LOADING = "loading"
    IN_CORE = "in core"
    FINISHING = "finishing"
    RETRY = "retry"

    # Members are singletons compared by identity: the identity hash is consistent with that,
    # and is computed in C (Enum's own __hash__ is a Python call at every _ALLOWED lookup).
    __hash__ = object.__hash__


_ALLOWED: dict[MessageState | None, frozenset[MessageState | None]] = {
    None: frozenset({MessageState.WAITING, MessageState.LOADING}),
    MessageState.WAITING: frozenset({MessageState.LOADING, None}),
    MessageState.LOADING: frozenset({MessageState.IN_CORE, None}),
    MessageState.IN_CORE: frozenset({MessageState.FINISHING}),
    MessageState.FINISHING: frozenset({MessageState.RETRY, None}),
    MessageState.RETRY: frozenset({MessageState.FINISHING, None}),
}

Source = str  # "incoming" | "deferred": where a waiting message is loaded from

# Message content held in memory between a load and the deliveries (the load reads the whole
# file anyway; a delivery then costs no file read): at most CONTENT_KEEP bytes per message and
# CONTENT_HELD bytes for all messages in core together (a bigger message, or one loaded while
# the budget is spent, is read from its file by its deliveries, as before).
CONTENT_KEEP = 256 * 1024
CONTENT_HELD = 8 * 1024 * 1024


@dataclass(slots=True, eq=False)
class ActiveMessage:
    """A loaded message (the core's ``payload``): its file and what this pass found."""

    queue_id: str
    path: Path
    qf: QueueFile
    queued_time: float
    deferred: bool = False  # some recipient was deferred in this pass
    bounced: bool = False  # the bounce log holds reasons not yet returned to the sender
    corrupt: str | None = None  # the file turned out unreadable mid-pass
    problem: str | None = None  # a step or the system failed: defer with this reason text
    pending_defer: list[ReasonRecord] = field(default_factory=list)  # not yet in defer/
    forced_expire: bool = False  # marked by ``qmgrd expire``: returned when this pass ends
    # The first recipients, read by the load's own job: (offset, records or the read's
    # exception, next offset); the first read request they cover needs no job (Loader.read).
    prefetch: tuple[int, list[RecipientRecord] | Exception, int] | None = None
    # The content, read by the load's own job (small messages, within CONTENT_HELD):
    # deliveries send it without reading the file again. Dropped when the pass ends.
    content: bytes | None = None
    # Its last delivery's file job removes its file if it can (``Recorder.record``): the
    # record is FINISHING from then on (early), and once the file is gone (retired) the
    # finish only reports it removed.
    early: bool = False
    retired: bool = False


@dataclass(slots=True, eq=False)
class Tracked:
    """One message's record in the table."""

    queue_id: str
    state: MessageState
    source: Source
    op: Operation | None = None  # the operator's operation, applied when the pass ends
    active: ActiveMessage | None = None  # set from IN_CORE on
    retry_at: float = 0.0  # RETRY: when the finish runs again
    failures: int = 0  # finishes that failed in a row (backoff)
    waiter: asyncio.Event | None = None  # made by ``settled`` only when someone waits
    flow: Flow = FLOW_NONE  # fair admission's flow (qmgrd.daemon.flows)
    admitted: bool = False  # taken by next_waiting: counted in its flow until done


class MessageTable:
    """The engine's known messages, one checked state each (see the module doc)."""

    def __init__(self, admission: Admission | None = None) -> None:
        """An empty table; ``admission`` orders the waiting messages (default: no limits)."""
        self._records: dict[str, Tracked] = {}
        self.admission = admission or Admission()
        self._retry: dict[str, Tracked] = {}  # RETRY records: every pass looks at them
        self.loading = 0  # records in LOADING (cheap for the feed's limit check)
        self.content_held = 0  # bytes of content held by IN_CORE messages (CONTENT_HELD)

    # ------------------------------------------------------------------ queries

    def find(self, queue_id: str) -> Tracked | None:
        """The record of ``queue_id``, or None."""
        return self._records.get(queue_id)

    def __contains__(self, queue_id: object) -> bool:
        """Whether the engine knows ``queue_id`` in any state."""
        return queue_id in self._records

    def __len__(self) -> int:
        """Number of known messages."""
        return len(self._records)

    def in_state(self, state: MessageState) -> Iterator[Tracked]:
        """The records in ``state`` (a snapshot: the table may change while iterating)."""
        if state is MessageState.RETRY:
            return iter(list(self._retry.values()))
        return iter([r for r in self._records.values() if r.state is state])

    @property
    def waiting(self) -> int:
        """Messages waiting to be loaded."""
        return len(self.admission)

    def next_retry(self) -> float | None:
        """The earliest ``retry_at`` of a RETRY record, or None."""
        if not self._retry:
            return None
        return min(r.retry_at for r in self._retry.values())

    # ------------------------------------------------------------------ moves

    def create(
        self, queue_id: str, source: Source, *, waiting: bool = True, flow: Flow = FLOW_NONE
    ) -> Tracked | None:
        """Start tracking ``queue_id`` (WAITING, queued for loading as a message of
        ``flow``); None if already known."""
        if queue_id in self._records:
            return None
        state = MessageState.WAITING if waiting else MessageState.LOADING
        record = Tracked(queue_id, state, source, flow=flow)
        if waiting:
            self.admission.add(queue_id, source, flow)  # checks the source
        self._records[queue_id] = record
        if not waiting:
            self.loading += 1
        return record

    def content_room(self) -> int:
        """How big a content a load may read to hold now (0: none; see ``CONTENT_HELD``)."""
        return min(CONTENT_KEEP, CONTENT_HELD - self.content_held)

    def hold_content(self, msg: ActiveMessage, content: bytes | None) -> None:
        """``msg`` (just loaded) keeps ``content`` for its deliveries if the budget allows."""
        if content is not None and self.content_held + len(content) <= CONTENT_HELD:
            msg.content = content
            self.content_held += len(content)

    def move(self, record: Tracked, state: MessageState) -> None:
        """Change ``record``'s state; InvariantError for a move the table does not allow."""
        self._check(record, state)
        if record.state is MessageState.IN_CORE and record.active is not None:
            content, record.active.content = record.active.content, None  # the pass ended
            if content is not None:
                self.content_held -= len(content)
        if record.state is MessageState.LOADING:
            self.loading -= 1
        elif record.state is MessageState.RETRY:
            del self._retry[record.queue_id]
        if state is MessageState.LOADING:
            self.loading += 1
        elif state is MessageState.RETRY:
            self._retry[record.queue_id] = record
        record.state = state
        self._settle(record)

    def done(self, record: Tracked) -> None:
        """Forget ``record`` (its file work is over, or an operator took it)."""
        self._check(record, None)
        if record.admitted:
            self.admission.release(record.flow)
        if record.state is MessageState.WAITING:
            self.admission.remove(record.queue_id)
        elif record.state is MessageState.LOADING:
            self.loading -= 1
        elif record.state is MessageState.RETRY:
            del self._retry[record.queue_id]
        del self._records[record.queue_id]
        if record.waiter is not None:
            record.waiter.set()

    def next_waiting(self, room: bool, now: float = 0.0) -> Tracked | None:
        """The next WAITING message to load (fair between flows), now LOADING; None when
        nothing waits or every waiting flow is at its limit.

        ``room``: whether the active queue still has room after this one; when
        it is full, incoming gets the next slot (notes §1). ``now``: for the
        per-flow rate.
        """
        found = self.admission.next(room, now)
        if found is None:
            return None
        queue_id, source, _flow = found
        record = self._records[queue_id]
        if record.state is not MessageState.WAITING or record.source != source:
            raise InvariantError(f"{queue_id}: queued for loading while {record.state.value}")
        record.admitted = True
        record.state = MessageState.LOADING
        self.loading += 1
        self._settle(record)
        return record

    # ------------------------------------------------------------------ internals

    def _check(self, record: Tracked, state: MessageState | None) -> None:
        if self._records.get(record.queue_id) is not record:
            raise InvariantError(f"{record.queue_id}: not in the active-message table")
        if state not in _ALLOWED[record.state]:
            target = "gone" if state is None else state.value
            raise InvariantError(
                f"{record.queue_id}: illegal move from {record.state.value} to {target}"
            )

    def settled(self, record: Tracked) -> asyncio.Event:
        """An event set while ``record`` is neither LOADING nor FINISHING (or gone)."""
        if record.waiter is None:
            record.waiter = asyncio.Event()
            self._settle(record)
        return record.waiter

    @staticmethod
    def _settle(record: Tracked) -> None:
        if record.waiter is None:
            return
        if record.state in (MessageState.LOADING, MessageState.FINISHING):
            record.waiter.clear()
        else:
            record.waiter.set()


def active_of(message: Message) -> ActiveMessage:
    """The engine's record carried as a core message's payload."""
    payload = message.payload
    if not isinstance(payload, ActiveMessage):
        raise InvariantError(f"message {message.queue_id} carries no engine record")
    return payload


def record_of(rcpt: ResolvedRecipient) -> RecipientRecord:
    """The queue-file record carried as a resolved recipient's payload."""
    payload = rcpt.payload
    if not isinstance(payload, RecipientRecord):
        raise InvariantError(f"recipient {rcpt.address} carries no queue-file record")
    return payload
