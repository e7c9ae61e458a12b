"""Jobs (message x transport), the preemption stack and recipient-slot flow (notes §2.5, §5, §6).

Contract
--------
- ``job_obtain(message, transport)`` finds or creates the job, links it (scheduler order and time
  order) if it is not linked, resets the candidate cache and clears its blocker mark (restarting
  entry selection at the head of the job list).
- ``job_retire(job)`` unlinks a job that has nothing to hand out now (it stays attached to its
  message; ``job_obtain`` revives it). ``job_free(job)`` disposes of it with its message; it is an
  error to free a job that still has recipients in core.
- ``job_preempt(current, now)`` is the preemption step of entry selection; ``job_count_slots``
  accounts one selected entry; ``job_pop`` takes a job off its preemption stack with the refund to
  its original parent.
- ``job_move_limits(job)`` gives the job's unused recipient slots back to the transport pool and
  on to the oldest job that still has unread recipients.
- Every change of a transport's ``job_list`` is mirrored in its ``job_index``
  (:mod:`qmgrd.core.jobindex`), where the candidate search runs, and, with fairness on
  (``transport.fair``), in its fair set (:mod:`qmgrd.core.fairq`: linking deals the job's flow a
  fair queue, a preempting job goes to the head of its queue); ``job_free`` breaks the job's
  link cycles so that it is freed by reference counting.

Theory of operation (seed SCHEDULER_README 3.x, "How the preemption works")
---------------------------------------------------------------------------
Every selected entry earns its job one slot (``slots_available``). A job whose entries could be
delivered within the slots the current job may still accumulate is a preemption candidate; the best
candidate is the one with the highest age/total-entries score. The current job is preempted when
``floor(slots_available / cost) + loan >= expected * (100 - discount) / 100``; the full
``expected * cost`` is charged up front and the preempting job's ``slots_used`` starts at
``-expected``, so popping it later refunds unused reservations (or charges overuse) to its original
parent only. Charging ``cost`` slots for each preempting entry bounds the delay of a job of N
entries by N / (cost - 1) entries of other jobs, plus the slack of the loan and discount.

Times: ``now`` is in seconds; like Postfix's ``time_t`` it is truncated to whole seconds for the
candidate score and its cache. Counters are ints (C ``int``), the score and the right-hand side of
the preempt inequality are floats (C ``double``), notes §14.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import DList, Link
from qmgrd.core.fairq import FairJob
from qmgrd.core.jobindex import candidate_search, index_touch
from qmgrd.errors import InvariantError

if TYPE_CHECKING:
    from qmgrd.core.jobindex import Chunk
    from qmgrd.core.message import Message
    from qmgrd.core.peer import Peer
    from qmgrd.core.transport import Transport

__all__ = [
    "Job",
    "job_count_slots",
    "job_free",
    "job_max_entries",
    "job_move_limits",
    "job_obtain",
    "job_pop",
    "job_preempt",
    "job_retire",
]


@dataclass(slots=True, eq=False)
class Job:
    """One message's work on one transport (notes §2.5)."""

    message: Message
    transport: Transport
    stack_parent: Job | None = None
    stack_children: dict[Job, None] = field(default_factory=dict)  # insertion-ordered set
    stack_level: int = -1  # -1 not linked (retired), 0 normal, k > 0 depth in a stack
    blocker_tag: int = 0
    slots_used: int = 0
    slots_available: int = 0
    selected_entries: int = 0
    read_entries: int = 0
    rcpt_count: int = 0
    rcpt_limit: int = 0
    read_wait: bool = False  # skipped by selection while its message's read is in flight
    peers: dict[str, Peer] = field(default_factory=dict)  # by queue name
    peer_list: DList[Peer] = field(default_factory=DList)  # round robin
    transport_link: Link[Job] = field(init=False)  # on transport.job_list
    time_link: Link[Job] = field(init=False)  # on transport.job_bytime
    index_chunk: Chunk | None = None  # where it sits in transport.job_index (None: not linked)
    fair: FairJob | None = None  # its fair-queue record while transport.fair is set

    def __post_init__(self) -> None:
        """Create the two list links."""
        self.transport_link = Link(self)
        self.time_link = Link(self)

    @property
    def has_entries(self) -> bool:
        """HAS_ENTRIES: the job has TODO entries."""
        return self.selected_entries < self.read_entries

    @property
    def is_blocker(self) -> bool:
        """The job is marked with its transport's current blocker tag."""
        return self.blocker_tag == self.transport.blocker_tag

    def describe(self) -> str:
        """``queue_id/transport``, for error messages."""
        return f"{self.message.queue_id}/{self.transport.name}"


def job_max_entries(job: Job) -> int:
    """MAX_ENTRIES: an upper bound of the job's entries (read + unread recipients)."""
    return job.read_entries + job.message.rcpt_unread


# --------------------------------------------------------------------------- linking


def _job_link(job: Job) -> None:
    """Link a new or retired job into both lists by queued_time (notes §5.5)."""
    if job.stack_level >= 0:
        raise InvariantError(f"job_link: {job.describe()} already linked ({job.stack_level})")
    transport = job.transport
    message = job.message
    qtime = message.queued_time

    # Scheduler list: walk back from the tail past preempting children (stack_parent set) and
    # newer jobs; remember whether job_current was passed over.
    current = transport.job_current
    current_passed = current is None
    prev = transport.job_list.tail
    while prev is not None:
        pj = prev.item
        if pj.stack_parent is None and qtime - pj.message.queued_time >= 0:
            break
        if pj is current:
            current_passed = True
        prev = prev.prev
    list_prev = prev

    # Time list: the same walk without skipping.
    unread = transport.job_next_unread
    unread_passed = unread is None
    tprev = transport.job_bytime.tail
    while tprev is not None:
        tj = tprev.item
        if qtime - tj.message.queued_time >= 0:
            break
        if tj is unread:
            unread_passed = True
        tprev = tprev.prev

    job.stack_level = 0
    transport.job_list.insert_after(job.transport_link, list_prev)
    transport.job_index.insert_after(job, list_prev.item if list_prev is not None else None)
    transport.job_bytime.insert_after(job.time_link, tprev)

    if current_passed:
        transport.job_current = job

    if unread_passed:
        old = transport.job_next_unread
        transport.job_next_unread = job
        if old is not None:
            job_move_limits(old)

    # Take the whole pool; the excess flows back once the message is fully read.
    if transport.rcpt_unused > 0:
        job.rcpt_limit += transport.rcpt_unused
        message.rcpt_limit += transport.rcpt_unused
        transport.rcpt_unused = 0
    if transport.fair is not None:
        job_fair_link(job)


def job_fair_link(job: Job) -> None:
    """Put a linked job in its flow's fair queue (fairness on; qmgrd.core.fairq)."""
    transport = job.transport
    assert transport.fair is not None
    fj = job.fair
    if fj is None:
        fj = job.fair = FairJob(job, job.message.flow_for(transport.name))
    transport.fair.job_linked(fj)


def _job_unlink(job: Job) -> None:
    """Take a job off both lists; orphan its children; move job_current on."""
    if job.stack_level < 0:
        raise InvariantError(f"job_unlink: {job.describe()} is not linked")
    transport = job.transport
    if transport.job_current is job:
        nxt = job.transport_link.next
        transport.job_current = nxt.item if nxt is not None else None
    if transport.job_next_unread is job:
        # move_limits normally advanced it already; keep the pointer valid regardless.
        tnext = job.time_link.next
        while tnext is not None and not tnext.item.message.more:
            tnext = tnext.next
        transport.job_next_unread = tnext.item if tnext is not None else None
    if job is transport.candidate_cache or job is transport.candidate_cache_current:
        transport.reset_candidate_cache()
    for child in job.stack_children:
        child.stack_parent = None
    job.stack_children.clear()
    if job.fair is not None and job.fair.queue is not None and transport.fair is not None:
        transport.fair.job_unlinked(job.fair)
    transport.job_list.unlink(job.transport_link)
    transport.job_index.remove(job)
    transport.job_bytime.unlink(job.time_link)
    job.stack_level = -1


def job_obtain(message: Message, transport: Transport) -> Job:
    """Find or create the job of ``message`` on ``transport`` and make sure it is linked."""
    job = message.jobs.get(transport.name)
    if job is None:
        job = Job(message, transport)
        message.jobs[transport.name] = job
    if job.stack_level < 0:
        _job_link(job)
    transport.reset_candidate_cache()
    if job.blocker_tag == transport.blocker_tag or job.read_wait:
        job.blocker_tag = 0
        job.read_wait = False
        head = transport.job_list.head
        transport.job_current = head.item if head is not None else None
        if job.fair is not None and transport.fair is not None:
            transport.fair.job_ready(job.fair)
    return job


def job_retire(job: Job) -> None:
    """Unlink a job with nothing to hand out now (notes §5.5); job_obtain revives it."""
    if job.stack_level > 0:
        job_pop(job)
    job_move_limits(job)
    _job_unlink(job)


def job_free(job: Job) -> None:
    """Dispose of a job together with its message (notes §5.5)."""
    if job.rcpt_count != 0:
        raise InvariantError(f"job_free: {job.describe()} has {job.rcpt_count} recipients")
    if job.peers:
        raise InvariantError(f"job_free: {job.describe()} still has {len(job.peers)} peers")
    if job.stack_level > 0:
        job_pop(job)
    job_move_limits(job)
    if job.rcpt_limit != 0:
        raise InvariantError(f"job_free: {job.describe()} keeps {job.rcpt_limit} slots")
    if job.stack_level >= 0:
        _job_unlink(job)
    del job.message.jobs[job.transport.name]
    job.transport_link.release()
    job.time_link.release()
    if job.fair is not None:
        job.fair.link.release()
        job.fair = None


# --------------------------------------------------------------------------- slot flow


def job_move_limits(job: Job) -> None:
    """Return the job's unused recipient slots to the pool and the next unread job (notes §6)."""
    transport = job.transport
    message = job.message
    nxt = transport.job_next_unread
    if job is nxt:
        link = job.time_link.next
        while link is not None and not link.item.message.more:
            link = link.next
        nxt = link.item if link is not None else None
        transport.job_next_unread = nxt
    # The outstanding read's budget counts as in core: those slots are spoken for.
    spare = min(
        job.rcpt_limit - job.rcpt_count,
        message.rcpt_limit - message.rcpt_count - message.reserved,
    )
    if spare > 0:
        job.rcpt_limit -= spare
        message.rcpt_limit -= spare
        transport.rcpt_unused += spare
        if nxt is not None and transport.rcpt_unused > 0:
            pool = transport.rcpt_unused
            nxt.rcpt_limit += pool
            nxt.message.rcpt_limit += pool
            transport.rcpt_unused = 0


# --------------------------------------------------------------------------- preemption


def job_count_slots(job: Job) -> None:
    """Account one selected entry of ``job`` (notes §5.1)."""
    job.slots_available += 1
    job.slots_used += 1
    index_touch(job)  # its selected_entries just grew: fewer entries needed
    transport = job.transport
    if transport.candidate_cache_current is not job:
        transport.reset_candidate_cache()


def job_pop(job: Job) -> None:
    """Take ``job`` off its preemption stack, refunding its original parent (notes §5.4)."""
    if job.stack_level <= 0:
        raise InvariantError(f"job_pop: {job.describe()} is not on a stack ({job.stack_level})")
    transport = job.transport
    parent = job.stack_parent
    if parent is not None:
        if job.stack_level == parent.stack_level + 1:
            parent.slots_available -= job.slots_used * transport.params.delivery_slot_cost
        del parent.stack_children[job]
    for child in job.stack_children:
        child.stack_parent = parent
        if parent is not None:
            parent.stack_children[child] = None
    job.stack_children.clear()
    job.stack_parent = None
    if job is transport.candidate_cache or job is transport.candidate_cache_current:
        transport.reset_candidate_cache()
    job.stack_level = 0
    index_touch(job)


def _job_candidate(current: Job, now: int) -> Job | None:
    """The best job to preempt ``current`` (notes §5.3), memoised per transport."""
    transport = current.transport
    if transport.candidate_cache_current is current and (
        transport.candidate_cache_time == now or transport.candidate_cache is None
    ):
        return transport.candidate_cache
    best = candidate_search(current, now)
    transport.candidate_cache = best
    transport.candidate_cache_current = current
    transport.candidate_cache_time = now
    return best


def job_preempt(current: Job, now: float) -> Job:
    """Let the best candidate preempt ``current`` if it has earned enough slots (notes §5.2)."""
    transport = current.transport
    p = transport.params
    if current.slots_available <= 0:
        return current
    if job_max_entries(current) < p.minimum_delivery_slots * p.delivery_slot_cost:
        return current
    cand = _job_candidate(current, int(now))
    if cand is None:
        return current
    expected = job_max_entries(cand) - cand.selected_entries
    if current.slots_available // p.delivery_slot_cost + p.delivery_slot_loan < (
        expected * p.slot_loan_factor / 100.0
    ):
        return current

    if cand.stack_level > 0:
        job_pop(cand)
    transport.job_list.unlink(cand.transport_link)
    transport.job_list.insert_before(cand.transport_link, current.transport_link)
    transport.job_index.move_before(cand, current)
    cand.stack_parent = current
    current.stack_children[cand] = None
    cand.stack_level = current.stack_level + 1
    transport.job_current = cand
    transport.reset_candidate_cache()
    if cand.fair is not None and transport.fair is not None:
        transport.fair.job_first(cand.fair)

    current.slots_available -= expected * p.delivery_slot_cost
    cand.slots_used = -expected

    message = cand.message
    if message.more:
        extra = max(0, (p.extra_recipient_limit + transport.rcpt_unused + 1) // 2)
        cand.rcpt_limit += extra
        message.rcpt_limit += extra
        transport.rcpt_unused -= extra
    return cand
