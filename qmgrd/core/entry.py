"""Entries: one delivery request for one agent (notes §2.3, §4.4).

Contract
--------
An :class:`Entry` is a batch of up to ``destination_recipient_limit`` recipients of one message
for one destination queue (exactly one with VERP). It sits on its queue's todo list and its peer's
entry list while waiting (state TODO), and on its queue's busy list only while an agent has it
(state BUSY). The scheduler creates, selects, unselects and finishes entries; the engine only reads
them: ``message``, ``transport``, ``nexthop``, ``queue_name``, ``recipients`` and the
connection-cache flags ``cache_load`` / ``cache_store`` sampled when it was selected (notes §10.1).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import Link

if TYPE_CHECKING:
    from qmgrd.core.fairq import FairQueue
    from qmgrd.core.message import Message, ResolvedRecipient
    from qmgrd.core.peer import Peer
    from qmgrd.core.queue import Queue

__all__ = ["DFLAG_LOAD", "DFLAG_STORE", "Entry", "EntryState"]

DFLAG_LOAD = 1
"""Connection cache: the agent may reuse a cached session (Postfix DEL_REQ_FLAG_CONN_LOAD)."""
DFLAG_STORE = 2
"""Connection cache: the agent may keep its session for the next entry (DEL_REQ_FLAG_CONN_STORE)."""


class EntryState(enum.Enum):
    """Where an entry is: waiting, handed to an agent, or finished."""

    TODO = "todo"
    BUSY = "busy"
    DONE = "done"


@dataclass(slots=True, eq=False)
class Entry:
    """A batch of recipients of one message for one destination."""

    message: Message
    queue: Queue
    peer: Peer
    recipients: list[ResolvedRecipient] = field(default_factory=list)
    state: EntryState = EntryState.TODO
    dflags: int = 0  # the queue's LOAD/STORE flags when selected
    fair: FairQueue | None = None  # the fair queue charged for it while BUSY (fairness on)
    queue_link: Link[Entry] = field(init=False)  # on queue.todo or queue.busy
    peer_link: Link[Entry] = field(init=False)  # on peer.entries while TODO

    def __post_init__(self) -> None:
        """Create the list links (each list membership has its own link)."""
        self.queue_link = Link(self)
        self.peer_link = Link(self)

    @property
    def transport(self) -> str:
        """The master.cf service name that delivers this entry."""
        return self.queue.transport.name

    @property
    def nexthop(self) -> str:
        """The nexthop handed to the agent."""
        return self.queue.nexthop

    @property
    def queue_name(self) -> str:
        """The destination queue key."""
        return self.queue.name

    @property
    def cache_load(self) -> bool:
        """The agent may use a cached connection (notes §10.1)."""
        return bool(self.dflags & DFLAG_LOAD)

    @property
    def cache_store(self) -> bool:
        """The agent may keep its connection for the next entry (notes §10.1)."""
        return bool(self.dflags & DFLAG_STORE)
