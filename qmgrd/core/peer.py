"""Peers: one job's entries for one destination queue (notes §2.6, §4.4).

Contract
--------
A :class:`Peer` joins a job and a destination queue. ``entries`` holds the job's TODO entries for
that queue in FIFO order; ``refcount`` counts its TODO and BUSY entries. ``peer_obtain`` finds or
creates it (linked at the tail of the job's round-robin peer list); ``peer_done`` frees it, which
is allowed only at refcount 0. ``peer_select`` walks the job's peers from the head and returns the
first whose queue has room (``window > busy``) and that has a TODO entry, rotating it to the tail
(round robin over destinations within a message).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import DList, Link
from qmgrd.errors import InvariantError

if TYPE_CHECKING:
    from qmgrd.core.entry import Entry
    from qmgrd.core.job import Job
    from qmgrd.core.queue import Queue

__all__ = ["Peer", "peer_done", "peer_obtain", "peer_select"]


@dataclass(slots=True, eq=False)
class Peer:
    """A job's view of one destination queue."""

    job: Job
    queue: Queue
    refcount: int = 0
    entries: DList[Entry] = field(default_factory=DList)
    job_link: Link[Peer] = field(init=False)

    def __post_init__(self) -> None:
        """Create the link for the job's peer list."""
        self.job_link = Link(self)


def peer_obtain(job: Job, queue: Queue) -> Peer:
    """Find the job's peer for ``queue`` or create it at the tail of the job's peer list."""
    peer = job.peers.get(queue.name)
    if peer is None:
        peer = Peer(job, queue)
        job.peers[queue.name] = peer
        job.peer_list.append(peer.job_link)
    return peer


def peer_done(peer: Peer) -> None:
    """Free a peer that has no entries left."""
    if peer.refcount != 0 or peer.entries:
        raise InvariantError(f"peer_done: peer still has {peer.refcount} entries")
    job = peer.job
    del job.peers[peer.queue.name]
    job.peer_list.unlink(peer.job_link)
    peer.job_link.release()


def peer_select(job: Job) -> Peer | None:
    """The first peer with a TODO entry whose queue has room; rotated to the tail."""
    link = job.peer_list.head
    while link is not None:
        peer = link.item
        queue = peer.queue
        if queue.window.window > queue.busy.count and peer.entries.head is not None:
            job.peer_list.rotate(link)
            return peer
        link = link.next
    return None
