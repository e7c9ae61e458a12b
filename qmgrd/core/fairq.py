"""Fair queuing between flows within one transport (seed: APF queueset), sans-IO.

Contract
--------
A :class:`FairSet` belongs to one transport whose fairness key is not ``none``
(``Transport.fair``; None keeps Postfix's schedules). It holds ``queue_count`` fair queues and
the flows (:class:`~qmgrd.core.flow.Flow`) that have jobs linked on the transport. The scheduler
calls:

- ``job_linked(fj)`` / ``job_unlinked(fj)`` when a job enters or leaves the transport's job list
  (``qmgrd.core.job``): the job's flow is dealt a queue by shuffle sharding (below) the first time
  it is seen, and the job joins that queue's FIFO of jobs;
- ``job_ready(fj)`` (the job may deliver again) and ``job_first(fj)`` (it preempted: head of its
  queue);
- ``best(tag)``: the waiting queue with the smallest head virtual finish time, skipping queues
  whose walk found nothing to deliver since the last blocker-tag change or job change (the caller
  marks them ``exhausted_tag = tag`` and asks again);
- ``dispatch(fj, now)`` when an entry of the job is handed to an agent (returns the queue the
  entry keeps), ``complete(queue, service_time, now)`` when it finishes (``service_time`` = S,
  the real delivery time the engine measured; None = no correction).
- The scheduler glue: ``fair_configure(transport)`` (create, replace or drop the set when the
  transport's params ask), ``fair_complete(transport, entry, S, now)`` (delivered, or put back
  undelivered with ``now`` None: the whole charge is refunded).

Nothing here reads a clock: ``now`` is an argument. Per-selection work allocates at most the heap
record of the charged queue: queues, links and per-job records are created once and reused.

Theory of operation (the seed, adapted to mail)
-----------------------------------------------
*Virtual time.* ``R(t)`` advances at ``min(C, executing) / W(t)`` virtual seconds per real
second, where ``C`` is the transport's process limit (its concurrency; 0 = unlimited, then
``executing`` itself), ``executing`` the entries handed to agents through this set, and ``W(t)``
the sum of the weights of the non-empty queues (a queue is non-empty while it has linked jobs or
executing entries). With every weight 1 this is the seed's ``min(C, executing) / NEQ(t)``.

*Start and finish.* Each queue keeps a virtual start ``S_q``. When a queue turns non-empty it
starts at ``R(t)``. The head of the queue (its next delivery) finishes at ``S_q + G / w_q``; the
set offers the queue with the smallest head finish first. A dispatch advances ``S_q`` by
``G / w_q``; a completion with real delivery time ``S`` moves it back by ``(G - S) / w_q``, so the
queue is charged what its delivery really took. ``G`` (``guess``, default 1 s: SMTP deliveries
take tens of milliseconds over loopback, up to seconds remotely; any positive value keeps the
long-run behaviour, the seed says) is the same for every delivery. Weights divide the advance,
so a flow of weight 2 is charged half as much per delivery and gets twice the deliveries of a
weight-1 flow while both are backlogged. Bound (seed): a backlogged flow's service stays within
``C`` deliveries of its weighted fair share.

*Credit limit.* A queue whose jobs cannot deliver (their destinations are full or dead) keeps
its start while ``R`` moves on. At dispatch its start is raised to at least ``R - G / w_q``, so
it resumes with at most one delivery of credit instead of a burst that starves the others.

*Shuffle sharding.* A flow's hand is ``hand_size`` distinct queue indices dealt from a
deterministic 64-bit hash of its key (BLAKE2b, the same on every run and host, unlike
``hash()``), as the APF dealer does: index ``i`` of the hand is ``v mod (Q - i)`` of the running
quotient, skipping those already dealt. A new flow takes the queue of its hand with the fewest
jobs linked (ties: the first in the hand) and keeps it while it has jobs. A hostile sender who
makes many flows (many sender domains) fills at most ``queue_count`` queues, and another flow
shares a queue with it only if every queue of its own hand is taken. The defaults are the seed's
(APF's): 64 queues, hand size 8. Memory: one record per flow with jobs in core (bounded by
``qmgr_message_active_limit``), forgotten when its last job leaves.

*Weights of a queue.* Flows that collide on a queue share it; the queue's weight is the largest
weight among its flows (reset when the queue empties).
"""

from __future__ import annotations

import hashlib
import heapq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import DList, Link
from qmgrd.core.flow import Flow
from qmgrd.errors import InvariantError

if TYPE_CHECKING:
    from qmgrd.core.entry import Entry
    from qmgrd.core.job import Job
    from qmgrd.core.transport import Transport

__all__ = [
    "DEFAULT_GUESS",
    "FairJob",
    "FairQueue",
    "FairSet",
    "FlowState",
    "deal_hand",
    "fair_complete",
    "fair_configure",
]

DEFAULT_GUESS = 1.0  # G, seconds: the initial service-time guess of every delivery


def deal_hand(key: str, queue_count: int, hand_size: int) -> tuple[int, ...]:
    """The flow's hand: ``hand_size`` distinct queue indices from a stable hash of ``key``."""
    if not 1 <= hand_size <= queue_count:
        raise InvariantError(f"deal_hand: hand size {hand_size} for {queue_count} queues")
    value = int.from_bytes(
        hashlib.blake2b(key.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "big"
    )
    hand: list[int] = []
    for i in range(hand_size):
        value, pick = divmod(value, queue_count - i)
        # pick-th index among those not dealt yet (sorted), so every hand is distinct
        for dealt in sorted(hand):
            if dealt <= pick:
                pick += 1
        hand.append(pick)
    return tuple(hand)


@dataclass(slots=True, eq=False)
class FlowState:
    """One flow with jobs linked on the transport."""

    flow: Flow
    queue: FairQueue
    jobs: int = 0  # linked jobs of this flow
    dispatched: int = 0  # deliveries handed to agents while the flow was known


@dataclass(slots=True, eq=False)
class FairJob:
    """A job's fairness record: its flow and its place in its fair queue (reused across links)."""

    job: Job
    flow: Flow
    queue: FairQueue | None = None
    state: FlowState | None = None
    link: Link[FairJob] = field(init=False)

    def __post_init__(self) -> None:
        """Create the queue link."""
        self.link = Link(self)


@dataclass(slots=True, eq=False)
class FairQueue:
    """One fair queue: the jobs of the flows dealt to it, FIFO, and its virtual start."""

    index: int
    jobs: DList[FairJob] = field(default_factory=DList)
    virtual_start: float = 0.0
    weight: float = 1.0
    executing: int = 0
    flows: int = 0  # flows dealt to this queue and still known
    counted: bool = False  # counted in the set's non-empty weight
    current: FairJob | None = None  # walk cursor: where the last selection found an entry
    cursor_tag: int = 0  # the transport blocker tag the cursor is valid for
    exhausted_tag: int = 0  # transport blocker tag when a walk found nothing (0 = not)
    dispatched: int = 0
    stamp: int = 0  # bumped at each change of its head finish: older heap records are stale
    waiting_link: Link[FairQueue] = field(init=False)  # on FairSet.waiting while jobs linked

    def __post_init__(self) -> None:
        """Create the waiting-list link."""
        self.waiting_link = Link(self)


class FairSet:
    """The fair queues of one transport (see the module docstring)."""

    __slots__ = (
        "concurrency",
        "executing",
        "flows",
        "guess",
        "hand_size",
        "heap",
        "parked",
        "parked_tag",
        "queues",
        "stale",
        "updated_at",
        "virtual_time",
        "waiting",
        "weight_sum",
    )

    def __init__(
        self,
        queue_count: int = 64,
        hand_size: int = 8,
        *,
        concurrency: int = 0,
        guess: float = DEFAULT_GUESS,
    ) -> None:
        """``concurrency``: C, the transport's process limit (0 = unlimited)."""
        if queue_count < 1 or not 1 <= hand_size <= queue_count:
            raise InvariantError(f"FairSet: {queue_count} queues, hand size {hand_size}")
        if not guess > 0.0:
            raise InvariantError(f"FairSet: service-time guess {guess}")
        self.queues = tuple(FairQueue(i) for i in range(queue_count))
        self.hand_size = hand_size
        self.concurrency = concurrency
        self.guess = guess
        self.flows: dict[str, FlowState] = {}
        self.waiting: DList[FairQueue] = DList()  # queues with linked jobs
        # (head finish, index, stamp) of waiting queues; stale records are dropped when seen
        self.heap: list[tuple[float, int, int]] = []
        self.parked: list[FairQueue] = []  # popped as exhausted at blocker tag parked_tag
        self.parked_tag = 0
        self.stale = False  # the heap was not kept while fewer than two queues waited
        self.virtual_time = 0.0
        self.updated_at: float | None = None
        self.executing = 0
        self.weight_sum = 0.0

    # ------------------------------------------------------------------ virtual time

    def advance(self, now: float) -> None:
        """Bring R(t) up to ``now`` (rate min(C, executing) / W, module doc)."""
        last = self.updated_at
        self.updated_at = now
        if last is None or now <= last or self.weight_sum <= 0.0 or not self.executing:
            return
        busy = self.executing
        c = self.concurrency
        if 0 < c < busy:
            busy = c
        self.virtual_time += (now - last) * busy / self.weight_sum

    def _recount(self, queue: FairQueue) -> None:
        """Keep ``weight_sum`` equal to the weights of the non-empty queues."""
        nonempty = queue.executing > 0 or bool(queue.jobs)
        if nonempty == queue.counted:
            return
        queue.counted = nonempty
        if nonempty:
            self.weight_sum += queue.weight
            queue.virtual_start = self.virtual_time  # an empty queue starts at R(t)
        else:
            self.weight_sum -= queue.weight
            if self.weight_sum < 1e-9:
                self.weight_sum = 0.0

    # ------------------------------------------------------------------ jobs

    def job_linked(self, fj: FairJob, now: float | None = None) -> None:
        """``fj``'s job joined the transport's job list: deal its flow a queue, append it."""
        if fj.queue is not None:
            raise InvariantError(f"fair: job {fj.job.describe()} is already queued")
        if now is not None:
            self.advance(now)
        state = self.flows.get(fj.flow.key)
        if state is None:
            queue = self._pick(fj.flow.key)
            state = FlowState(fj.flow, queue)
            self.flows[fj.flow.key] = state
            if queue.flows == 0 or fj.flow.weight > queue.weight:
                self._reweigh(queue, fj.flow.weight)
            queue.flows += 1
        elif fj.flow.weight != state.flow.weight:
            state.flow = fj.flow  # a reloaded weight table: the newest weight counts
            if fj.flow.weight > state.queue.weight:
                self._reweigh(state.queue, fj.flow.weight)
        state.jobs += 1
        queue = state.queue
        fj.queue = queue
        fj.state = state
        was_empty = not queue.jobs
        queue.jobs.append(fj.link)
        if was_empty:
            self.waiting.append(queue.waiting_link)
            self._recount(queue)
        if queue.exhausted_tag:
            tag = fj.job.transport.blocker_tag
            if queue.exhausted_tag == tag:
                # Every job before it was walked at this tag and found nothing: walk from the
                # new job (nqmgr: current_passed). A mark from an older tag says nothing about
                # the jobs before it; moving the cursor past them would strand them (a
                # rate-delayed job's queue resumes without a blocker mark at this tag, so
                # nothing would walk back to it).
                queue.current, queue.cursor_tag = fj, tag
            queue.exhausted_tag = 0
        self._changed(queue)

    def job_unlinked(self, fj: FairJob) -> None:
        """``fj``'s job left the transport's job list (retired or freed)."""
        queue, state = fj.queue, fj.state
        if queue is None or state is None:
            raise InvariantError(f"fair: job {fj.job.describe()} is not queued")
        if queue.current is fj:
            nxt = fj.link.next
            queue.current = nxt.item if nxt is not None else None
        queue.jobs.unlink(fj.link)
        fj.queue = None
        fj.state = None
        state.jobs -= 1
        if state.jobs == 0:
            del self.flows[state.flow.key]
            queue.flows -= 1
        if not queue.jobs:
            self.waiting.unlink(queue.waiting_link)
            queue.current = None
            queue.exhausted_tag = 0
            self._recount(queue)

    def job_ready(self, fj: FairJob) -> None:
        """The job may deliver again (new recipients, no longer a blocker): its queue is walked
        again from the head (nqmgr restarts at the head of its job list then)."""
        queue = fj.queue
        if queue is not None:
            queue.exhausted_tag = 0
            queue.current = None
            self._changed(queue)

    def job_first(self, fj: FairJob) -> None:
        """The job preempted another (nqmgr): it goes to the head of its queue's FIFO."""
        queue = fj.queue
        if queue is None or queue.jobs.head is fj.link:
            return
        queue.jobs.unlink(fj.link)
        queue.jobs.prepend(fj.link)
        queue.current = None
        queue.exhausted_tag = 0
        self._changed(queue)

    def _pick(self, key: str) -> FairQueue:
        queues = self.queues
        best: FairQueue | None = None
        for index in deal_hand(key, len(queues), self.hand_size):
            queue = queues[index]
            if best is None or len(queue.jobs) < len(best.jobs):
                best = queue
        assert best is not None
        return best

    def _reweigh(self, queue: FairQueue, weight: float) -> None:
        if queue.counted:
            self.weight_sum += weight - queue.weight
        queue.weight = weight

    # ------------------------------------------------------------------ choice

    def finish(self, queue: FairQueue) -> float:
        """The virtual finish time of the queue's head (its next delivery)."""
        return queue.virtual_start + self.guess / queue.weight

    def _changed(self, queue: FairQueue) -> None:
        """The queue's head finish or state changed: record it in the heap (if it waits)."""
        if not queue.jobs:
            return
        queue.stamp += 1
        if self.waiting.count < 2:  # one waiting queue needs no ordering: keep no records
            self.stale = True
            return
        if self.stale:
            self._rebuild()
            return
        heap = self.heap
        heapq.heappush(
            heap, (queue.virtual_start + self.guess / queue.weight, queue.index, queue.stamp)
        )
        if len(heap) > 4 * len(self.queues) + 16:  # stale records pile up above the minimum
            self._rebuild()

    def _rebuild(self) -> None:
        guess = self.guess
        heap = self.heap
        heap.clear()
        for queue in self.waiting:
            heap.append((queue.virtual_start + guess / queue.weight, queue.index, queue.stamp))
        heapq.heapify(heap)
        self.parked.clear()
        self.stale = False

    def best(self, tag: int) -> FairQueue | None:
        """The waiting queue with the smallest head finish (ties: lowest index) that is not
        exhausted at blocker tag ``tag``; None when there is none. The caller marks a queue
        whose walk finds nothing (``exhausted_tag = tag``) and asks again. O(log Q) amortized:
        a heap with stale records dropped as they surface; exhausted queues are parked until
        the tag changes or the queue changes."""
        waiting = self.waiting
        if waiting.count < 2:
            only = waiting.head
            if only is None or only.item.exhausted_tag == tag:
                return None
            return only.item
        if self.stale:
            self._rebuild()
        parked = self.parked
        if parked and self.parked_tag != tag:
            for queue in parked:
                if queue.exhausted_tag != tag:
                    self._changed(queue)
            parked.clear()
        heap = self.heap
        queues = self.queues
        while heap:
            _fin, index, stamp = heap[0]
            queue = queues[index]
            if stamp != queue.stamp or not queue.jobs:
                heapq.heappop(heap)
                continue
            if queue.exhausted_tag == tag:
                heapq.heappop(heap)
                parked.append(queue)
                self.parked_tag = tag
                continue
            return queue
        return None

    # ------------------------------------------------------------------ service

    def dispatch(self, fj: FairJob, now: float) -> FairQueue:
        """An entry of ``fj``'s job went to an agent: charge its queue G / w (module doc,
        credit limit); returns the queue, which the entry keeps for ``complete``."""
        queue, state = fj.queue, fj.state
        if queue is None or state is None:
            raise InvariantError(f"fair: dispatch for unqueued job {fj.job.describe()}")
        state.dispatched += 1
        self.advance(now)
        step = self.guess / queue.weight
        floor = self.virtual_time - step
        if queue.virtual_start < floor:
            queue.virtual_start = floor
        queue.virtual_start += step
        queue.executing += 1
        queue.dispatched += 1
        self.executing += 1
        self._recount(queue)
        self._changed(queue)
        return queue

    def complete(self, queue: FairQueue, service_time: float | None, now: float | None) -> None:
        """An entry of ``queue`` finished after ``service_time`` seconds: correct by G - S
        (``now`` None: no time passed that the caller knows of)."""
        if now is not None:
            self.advance(now)
        if queue.executing <= 0:
            return  # dispatched by a set that a reload replaced: nothing to correct
        if service_time is not None and service_time >= 0.0:
            queue.virtual_start -= (self.guess - service_time) / queue.weight
        queue.executing -= 1
        self.executing -= 1
        self._recount(queue)
        self._changed(queue)


# --------------------------------------------------------------------------- scheduler glue


def fair_configure(transport: Transport) -> None:
    """Give ``transport`` the fair set its params ask for (create, keep, replace or drop it).

    A new set takes every linked job, in job-list order; a dropped one lets go of them. Entries
    busy at the change keep pointing at their old queue, whose completion then corrects nothing
    in the new set (``fair_complete`` checks the queue belongs to the current set).
    """
    p = transport.params
    fair = transport.fair
    if fair is not None and (
        not p.fairness
        or len(fair.queues) != p.fairness_queue_count
        or fair.hand_size != p.fairness_hand_size
    ):
        for job in transport.job_list:
            fj = job.fair
            if fj is not None and fj.queue is not None:
                fair.job_unlinked(fj)
        transport.fair = fair = None
    if fair is None and p.fairness:
        fair = FairSet(p.fairness_queue_count, p.fairness_hand_size, concurrency=p.process_limit)
        transport.fair = fair
        for job in transport.job_list:
            fj = job.fair
            if fj is None:
                fj = job.fair = FairJob(job, job.message.flow_for(transport.name))
            fair.job_linked(fj)
    if fair is not None:
        fair.concurrency = p.process_limit


def fair_complete(
    transport: Transport, entry: Entry, service_time: float | None, now: float | None
) -> None:
    """``entry`` left BUSY: delivered after ``service_time`` (G - S correction) or, with
    ``now`` None, put back undelivered (the whole charge refunded)."""
    queue = entry.fair
    entry.fair = None
    fair = transport.fair
    if queue is None or fair is None or fair.queues[queue.index] is not queue:
        return
    if now is None:
        fair.complete(queue, 0.0, None)
        queue.dispatched = max(0, queue.dispatched - 1)
        fj = entry.peer.job.fair
        if fj is not None and fj.state is not None and fj.state.dispatched > 0:
            fj.state.dispatched -= 1
    else:
        fair.complete(queue, service_time, now)
