"""Destination queues: one per transport x destination (notes §2.2, §7, §13.1-2).

Contract
--------
A :class:`Queue` holds the TODO and BUSY entries for one destination of one transport, its
concurrency window (B's ``ConcurrencyWindow``: the window *is* the state, READY > 0, THROTTLED 0,
SUSPENDED -1), the dead reason, the connection-cache flags and the blocker tag.

Lifecycle (enforced by the scheduler, which owns the timers):
- ``queue_create`` starts READY at the transport's initial concurrency and registers the queue
  with its transport.
- A READY queue is deleted (``queue_done``) as soon as it has no TODO and no BUSY entries, so the
  learned window is lost when a destination goes idle. It is an error to delete a queue that still
  has entries.
- A THROTTLED (dead) queue stays as the dead-destination cache until its revival timer
  (``minimal_backoff_time``) fires, a delivery to it completes with positive feedback, or a flush.
- A SUSPENDED queue (``destination_rate_delay``) is never deleted until it resumes.

Timers are lazy: ``revive_at`` / ``resume_at`` hold the deadline the queue currently waits for;
a heap record whose deadline no longer matches is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import DList
from qmgrd.core.feedback import ConcurrencyWindow
from qmgrd.errors import InvariantError

if TYPE_CHECKING:
    from qmgrd.core.entry import Entry
    from qmgrd.core.transport import Transport

__all__ = ["Queue", "queue_create", "queue_done"]


@dataclass(slots=True, eq=False)
class Queue:
    """Everything one transport delivers to one destination."""

    name: str  # queue key (nexthop, or localpart@nexthop), already lowercased by the resolver
    nexthop: str  # passed to the agent
    transport: Transport
    window: ConcurrencyWindow
    todo: DList[Entry] = field(default_factory=DList)
    busy: DList[Entry] = field(default_factory=DList)
    dsn: tuple[str, str] | None = None  # (status, reason) while THROTTLED
    dflags: int = 0  # connection-cache LOAD/STORE flags
    last_done: float = float("-inf")  # time of the last BUSY completion (back-to-back test)
    blocker_tag: int = 0
    revive_at: float | None = None  # dead timer deadline
    resume_at: float | None = None  # rate-delay or throttle-hold deadline
    throttle_delay: float = 0.0  # the last throttle hold's length; 0 after positive feedback
    deleted: bool = False

    @property
    def state(self) -> str:
        """``ready``, ``throttled`` or ``suspended`` (from the window)."""
        return self.window.state

    def describe(self) -> str:
        """``transport/name``, for error messages and logs."""
        return f"{self.transport.name}/{self.name}"


def queue_create(transport: Transport, name: str, nexthop: str) -> Queue:
    """Create a READY queue for ``name`` and register it with ``transport``."""
    if name in transport.queues:
        raise InvariantError(f"queue_create: {transport.name}/{name} exists")
    p = transport.params
    window = ConcurrencyWindow(
        init=p.effective_initial_concurrency,
        limit=p.effective_concurrency_limit,
        positive=p.positive_feedback,
        negative=p.negative_feedback,
        cohort_limit=p.failed_cohort_limit,
    )
    queue = Queue(name=name, nexthop=nexthop, transport=transport, window=window)
    transport.queues[name] = queue
    return queue


def queue_done(queue: Queue) -> None:
    """Delete an empty queue (READY, or THROTTLED whose cache entry expires)."""
    if queue.todo or queue.busy:
        raise InvariantError(
            f"queue_done: {queue.describe()} still has {len(queue.todo)} todo and "
            f"{len(queue.busy)} busy entries"
        )
    if queue.window.suspended:
        raise InvariantError(f"queue_done: {queue.describe()} is suspended")
    if queue.deleted:
        raise InvariantError(f"queue_done: {queue.describe()} already deleted")
    queue.deleted = True
    queue.revive_at = queue.resume_at = None
    del queue.transport.queues[queue.name]
