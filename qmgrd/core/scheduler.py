"""The scheduler facade: Postfix nqmgr as a sans-IO library (notes §2-§8, DESIGN §5).

Contract (what the engine calls)
--------------------------------
``Scheduler(params, transport_params)`` with a :class:`SchedulerParams` and a callable giving the
:class:`TransportParams` of a master.cf service name. No method reads files, sleeps or reads the
clock: every time is an argument ``now`` (seconds, one reading per event).

Messages and reads
    ``message_create(queue_id, *, queued_time, rcpt_unread, single_rcpt=False, rcpt_offset=0,
    payload=None, flow=FLOW_NONE, transport_flows=None) -> Message`` registers a message (its
    fairness flow matters only on transports with ``TransportParams.fairness``) and queues the
    read request for its first batch (budget
    ``max(qmgr_message_recipient_limit - in-core, qmgr_message_recipient_minimum)``, at most
    5000). ``pop_reads() -> list[ReadRequest]`` drains every pending read request (the first
    batch, refills requested by entry selection, the refill after the last entry finished, and
    refill-delay timers); each request is returned exactly once. The engine reads up to
    ``request.limit`` recipients from ``request.offset``, resolves them and calls
    ``recipients_add(message, recipients, next_offset, now, skipped=0)`` (``next_offset`` 0 = the
    file is fully read; ``skipped`` = done/cancelled records passed over, to sharpen the estimate).

    Rule for asynchronous reads: at most one read per message is outstanding. While it is in flight
    the message counts as not fully read, its budget is reserved (never given away by slot
    transfers), and a job of that message that has no TODO entries is skipped by entry selection
    but neither retired nor marked a blocker (``job.read_wait``). When the batch arrives, every such
    job makes its transport restart selection at the head of its job list, like a blocker that got
    new recipients in Postfix.

Dispatch
    ``select(now) -> Entry | None``: transports round robin (skipping dead and rate-locked ones and
    those with ``busy >= process_limit``), then the job list with preemption and blockers, then the
    job's destinations round robin; a destination gives an entry only while ``busy < window``. Call
    it until None, and again after every event. With fairness on for a transport, the job list
    walk is replaced by fair queuing between flows composed with nqmgr (see "fair queuing" below
    and docs/fairness.md).

Completion
    ``entry_done(entry, *, hop_failure=None, crashed=False, now, service_time=None)`` (the
    delivery's real duration, for fair queuing's G - S correction): Postfix ``deliver_update`` +
    ``entry_done``: feedback (hop_failure = (dsn, reason) is negative feedback, none is positive,
    a crash is neither), rate-delay suspension, blocker updates, slot returns, queue deletion.
    ``entry_throttled(entry, *, kind, hop, now, observed_busy=None) -> bool``: the entry's session
    was refused (``kind`` "full": a 421 greeting or a refused connection; "rate": a throttling
    reply). With ``destination_concurrency_learning`` and while the destination demonstrably
    works, the entry goes back to its queue's TODO list (True: the engine records nothing for its
    recipients). False changes nothing: the caller goes on with ``entry_done(hop_failure=hop)``
    exactly as before (see "Learned destination limits" below).
    ``completes_message(entry) -> bool``: True when ``entry_done`` of this BUSY entry will report
    its message done (its last live entry, nothing left to read; a hop failure may end it too).
    ``transport_failed(name, dsn, reason, now, entry=None)``: the agent could not run at all; the
    transport is dead for ``transport_retry_time`` and its TODO entries are deferred (``entry``, if
    given, is the selected entry that could not be sent; it is deferred with them).

Events, timers, control
    ``pop_events()`` drains :mod:`qmgrd.core.events` values. ``next_deadline() -> float | None`` is
    the earliest time ``run_timers(now)`` has work (queue revival, transport revival, rate-delay
    resume and unlock, refill delay). ``flush(now)`` unthrottles every transport and queue;
    ``flush_destination(name, now)`` the queues of that name. ``update_params(params,
    transport_params)`` applies reloaded settings without dropping in-core mail.

Introspection
    ``transports()`` (each with ``queues``: window, ``todo``/``busy`` lists, ``dsn``),
    ``message_count``, ``rcpt_count``, ``find_message(queue_id)``.

Learned destination limits (not in Postfix; ``destination_concurrency_learning``)
--------------------------------------------------------------------------------
Postfix treats a session refused by a full server (421 greeting, refused connection) as a
destination failure: negative feedback, and the entry's recipients go to ``deferred/`` for at
least ``minimal_backoff_time`` although other sessions to the same server are delivering. Against
a server admitting 5 sessions that defers 1/6 to 1/2 of the mail (seed SCHEDULER_README). With
learning, ``entry_throttled`` decides:

- kind "full" with ``observed`` > 0 other sessions working (``len(busy) - 1`` unless the caller
  knows better): the window settles at ``observed`` (``ConcurrencyWindow.settle``) and the entry
  goes back to the TODO list; it is selected again when a session frees. No feedback, no
  dead-destination count. With nothing else working it is a real failure: False.
- kind "rate" (the server asked us to slow down): the window is held (``hold``, SUSPENDED) for
  ``destination_throttle_delay``, doubling with each further throttle until a delivery succeeds,
  then resumes at ``max(1, observed)``; the entry goes back. When the next pause would exceed
  ``minimal_backoff_time`` the throttle is treated as a failure (False): the caller defers as
  Postfix does, so a server that never stops throttling cannot keep mail in the active queue.
- The destination must be READY; a dead or paused destination gets False.

Deviations from Postfix (see also DESIGN §9)
--------------------------------------------
- No agent allocation step: ``select`` tries each eligible transport's job list directly instead
  of pre-counting queue capacity (``transport_select``); a transport is rotated to the tail only
  when it yields an entry. ``process_limit`` bounds busy entries per transport.
- ``transport_rate_delay``: the rate lock is taken at selection and released
  ``transport_rate_delay`` after the delivery completes (crash included), which gives the same
  gap as Postfix's "allocate, wait, then select" without the stuck-lock hazard (notes §7.5).
- Recipients for a dead destination or transport are reported as deferred events instead of being
  moved to the ``retry`` transport.
- Refill delay: when selection finds a job whose message could refill but only after
  ``recipient_refill_delay``, a timer issues that refill when it is due.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Literal

from qmgrd.core.dll import DList, Link
from qmgrd.core.entry import DFLAG_LOAD, DFLAG_STORE, Entry, EntryState
from qmgrd.core.events import (
    DestinationDead,
    DestinationRevived,
    DestinationThrottled,
    Event,
    MessageDone,
    RecipientsDeferred,
    TransportDead,
    TransportRevived,
)
from qmgrd.core.fairq import FairSet, fair_complete, fair_configure
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.core.job import (
    Job,
    job_count_slots,
    job_free,
    job_move_limits,
    job_obtain,
    job_preempt,
    job_retire,
)
from qmgrd.core.jobindex import index_touch
from qmgrd.core.message import Message, ReadRequest, ResolvedRecipient
from qmgrd.core.params import READ_BATCH_LIMIT, SchedulerParams, TransportParams
from qmgrd.core.peer import Peer, peer_done, peer_obtain, peer_select
from qmgrd.core.queue import Queue, queue_create, queue_done
from qmgrd.core.transport import Transport
from qmgrd.errors import InvariantError

ThrottleKind = Literal["full", "rate"]

__all__ = ["Scheduler", "ThrottleKind"]

TransportParamsFn = Callable[[str], TransportParams]

_DSN_RE = re.compile(r"^[245]\.\d{1,3}\.\d{1,3}$")
_SUSPENDED_PREFIX = "delivery temporarily suspended: "

# Timer kinds (heap records are (deadline, seq, kind, object); stale ones are skipped).
_T_QUEUE_REVIVE = 0
_T_QUEUE_RESUME = 1
_T_TRANSPORT_REVIVE = 2
_T_TRANSPORT_UNLOCK = 3
_T_REFILL = 4

_TimerObj = Queue | Transport | Message


class Scheduler:
    """The queue manager's in-core state and decisions (see the module docstring)."""

    def __init__(self, params: SchedulerParams, transport_params: TransportParamsFn) -> None:
        """Start empty; transports are created when recipients first resolve to them."""
        self.params = params
        self._transport_params = transport_params
        self._transports: dict[str, Transport] = {}
        self._transport_list: DList[Transport] = DList()
        self._messages: dict[str, Message] = {}
        self.rcpt_count = 0  # recipients in core, all messages
        self._reserved = 0  # budgets of outstanding reads
        self.queue_count = 0
        self._reads: list[ReadRequest] = []
        self._events: list[Event] = []
        self._timers: list[tuple[float, int, int, _TimerObj]] = []
        self._timer_seq = 0

    # ------------------------------------------------------------------ introspection

    @property
    def message_count(self) -> int:
        """Messages in core."""
        return len(self._messages)

    def find_message(self, queue_id: str) -> Message | None:
        """The in-core message with this queue id, if any."""
        return self._messages.get(queue_id)

    def transports(self) -> Iterator[Transport]:
        """Every transport, in round-robin order."""
        return iter(self._transport_list)

    def find_transport(self, name: str) -> Transport | None:
        """The transport of this name, if it exists."""
        return self._transports.get(name)

    # ------------------------------------------------------------------ configuration

    def update_params(self, params: SchedulerParams, transport_params: TransportParamsFn) -> None:
        """Apply reloaded settings to live transports and queues; in-core mail is kept."""
        self.params = params
        self._transport_params = transport_params
        for transport in self._transport_list:
            new = transport_params(transport.name)
            transport.rcpt_unused += new.recipient_limit - transport.params.recipient_limit
            transport.params = new
            for queue in transport.queues.values():
                queue.window.update_limits(
                    new.effective_initial_concurrency,
                    new.effective_concurrency_limit,
                    new.positive_feedback,
                    new.negative_feedback,
                    new.failed_cohort_limit,
                )
            if new.transport_rate_delay <= 0 and transport.rate_locked:
                transport.rate_locked = False
                transport.unlock_at = None
            fair_configure(transport)

    def _transport_obtain(self, name: str) -> Transport:
        transport = self._transports.get(name)
        if transport is None:
            params = self._transport_params(name)
            transport = Transport(name, params, rcpt_unused=params.recipient_limit)
            fair_configure(transport)
            self._transports[name] = transport
            self._transport_list.prepend(transport.link)
        return transport

    # ------------------------------------------------------------------ messages and reads

    def message_create(
        self,
        queue_id: str,
        *,
        queued_time: float,
        rcpt_unread: int,
        single_rcpt: bool = False,
        rcpt_offset: int = 0,
        payload: object = None,
        flow: Flow = FLOW_NONE,
        transport_flows: Mapping[str, Flow] | None = None,
    ) -> Message:
        """Register a message entering the active queue and request its first batch.

        ``flow`` (and ``transport_flows``, per-transport overrides) only matter on transports
        with fairness on (``TransportParams.fairness``); FLOW_NONE everywhere = nqmgr exactly."""
        if queue_id in self._messages:
            raise InvariantError(f"message_create: {queue_id} is already in core")
        if len(self._messages) >= self.params.qmgr_message_active_limit:
            raise InvariantError(f"message_create: {queue_id} exceeds qmgr_message_active_limit")
        message = Message(  # positional where it can: keywords cost more (one per message)
            queue_id,
            queued_time,
            max(0, rcpt_unread),  # rcpt_unread
            self.params.qmgr_message_recipient_minimum,  # rcpt_limit
            single_rcpt,
            payload,
            rcpt_offset,
            flow=flow,
            transport_flows=transport_flows or None,
        )
        self._messages[queue_id] = message
        in_core = self.rcpt_count + self._reserved
        budget = max(self.params.recipient_limit - in_core, message.rcpt_limit)
        self._read_request(message, budget)
        return message

    def pop_reads(self) -> list[ReadRequest]:
        """Drain the pending read requests (each is returned once)."""
        reads, self._reads = self._reads, []
        return reads

    def _read_request(self, message: Message, budget: int) -> None:
        if message.reading:
            raise InvariantError(f"read request: {message.queue_id} already has a read in flight")
        budget = min(budget, READ_BATCH_LIMIT)
        if budget <= 0:
            raise InvariantError(f"read request: {message.queue_id} budget {budget}")
        request = ReadRequest(message, message.rcpt_offset, budget)
        message.reading = True
        message.reserved = budget
        message.pending_read = request
        self._reserved += budget
        self._reads.append(request)

    def _refill(self, message: Message) -> None:
        self._read_request(message, message.rcpt_limit - message.rcpt_count)

    def recipients_add(
        self,
        message: Message,
        recipients: Sequence[ResolvedRecipient],
        next_offset: int,
        now: float,
        *,
        skipped: int = 0,
    ) -> None:
        """Accept a batch read for ``message``'s outstanding request (notes §3.4)."""
        if message.finished or not message.reading:
            raise InvariantError(f"recipients_add: {message.queue_id} has no read in flight")
        if len(recipients) > message.reserved:
            raise InvariantError(
                f"recipients_add: {message.queue_id} got {len(recipients)} recipients for a "
                f"budget of {message.reserved}"
            )
        self._reserved -= message.reserved
        message.reserved = 0
        message.reading = False
        message.pending_read = None
        message.rcpt_offset = next_offset
        message.more = next_offset != 0
        if message.more:
            message.rcpt_unread = max(0, message.rcpt_unread - len(recipients) - skipped)
        else:
            message.rcpt_unread = 0
        message.refill_time = now

        for job in message.jobs.values():
            if job.read_wait:
                job.read_wait = False
                if job.stack_level >= 0:
                    head = job.transport.job_list.head
                    job.transport.job_current = head.item if head is not None else None
                    if job.fair is not None and job.transport.fair is not None:
                        job.transport.fair.job_ready(job.fair)

        deferred: dict[tuple[str, str], list[ResolvedRecipient]] = {}
        self._assign(message, recipients, deferred)
        for (status, reason), rcpts in deferred.items():
            self._events.append(RecipientsDeferred(message, tuple(rcpts), status, reason))

        for job in message.jobs.values():
            index_touch(job)  # fewer unread recipients: fewer entries needed
            if job.has_entries and not job.is_blocker:
                job.transport.reset_candidate_cache()
        if not message.more:
            for job in list(message.jobs.values()):
                job_move_limits(job)
        if message.refcount == 0:
            self._message_idle(message)

    def _assign(
        self,
        message: Message,
        recipients: Sequence[ResolvedRecipient],
        deferred: dict[tuple[str, str], list[ResolvedRecipient]],
    ) -> None:
        """Bind recipients to transports, queues, jobs, peers and entries (notes §3.4)."""
        ordered = (
            sorted(recipients, key=lambda r: (r.transport, r.queue_name))
            if len(recipients) > 1
            else recipients  # one (most messages): nothing to sort, no key call
        )
        job = None
        peer: Peer | None = None
        for rcpt in ordered:
            transport = self._transport_obtain(rcpt.transport)
            if transport.dead:
                assert transport.dsn is not None
                deferred.setdefault(transport.dsn, []).append(rcpt)
                continue
            queue = transport.queues.get(rcpt.queue_name)
            if queue is None:
                queue = queue_create(transport, rcpt.queue_name, rcpt.nexthop)
                last_done = transport.recent_done.pop(rcpt.queue_name, None)
                if last_done is not None:
                    queue.last_done = last_done
                self.queue_count += 1
            elif queue.window.throttled:
                assert queue.dsn is not None
                deferred.setdefault(queue.dsn, []).append(rcpt)
                continue
            if job is None or job.transport is not transport:
                job = job_obtain(message, transport)
                peer = None
            if peer is None or peer.queue is not queue:
                peer = peer_obtain(job, queue)
            tail = peer.entries.tail
            limit = transport.params.destination_recipient_limit
            if (
                tail is None
                or message.single_rcpt
                or (limit > 0 and len(tail.item.recipients) >= limit)
            ):
                entry = Entry(message, queue, peer)
                peer.entries.append(entry.peer_link)
                queue.todo.append(entry.queue_link)
                peer.refcount += 1
                message.refcount += 1
                job.read_entries += 1
            else:
                entry = tail.item
            entry.recipients.append(rcpt)
            job.rcpt_count += 1
            message.rcpt_count += 1
            self.rcpt_count += 1

    def _message_idle(self, message: Message) -> None:
        """refcount reached 0: read the next batch, or report the message done and free it."""
        if message.more:
            if not message.reading:
                self._refill(message)
            return
        for job in list(message.jobs.values()):
            job_free(job)
        message.finished = True
        message.refill_timer_at = None
        del self._messages[message.queue_id]
        self._events.append(MessageDone(message))

    # ------------------------------------------------------------------ selection

    def select(self, now: float) -> Entry | None:
        """The next entry to hand to an agent, or None (notes §4)."""
        link = self._transport_list.head
        while link is not None:
            nxt = link.next
            transport = link.item
            limit = transport.params.process_limit
            if (
                transport.dead
                or transport.rate_locked
                or (limit > 0 and transport.busy >= limit)  # at_process_limit, inlined
            ):
                link = nxt
                continue
            if transport.fair is None:
                entry = self._job_entry_select(transport, now)
            else:
                entry = self._fair_entry_select(transport, transport.fair, now)
            if entry is not None:
                self._transport_list.rotate(link)
                transport.busy += 1
                if transport.params.transport_rate_delay > 0:
                    transport.rate_locked = True
                return entry
            link = nxt
        return None

    def _job_entry_select(self, transport: Transport, now: float) -> Entry | None:
        """Postfix ``qmgr_job_entry_select`` with the asynchronous-read rule (notes §4.3)."""
        job = transport.job_current
        if job is None:
            return None
        if transport.params.delivery_slot_cost >= 2:
            job = job_preempt(job, now)
        tag = transport.blocker_tag
        link: Link[Job] | None = job.transport_link
        # The walk visits every job after a blocker tag bump (each delivery to a full
        # destination), so the common case is inlined: a message with nothing left to read
        # (no refill rules) gets _job_peer_select's peer_select without the calls, and a job
        # that finds no peer marks itself and its queues in the same loop. Same decisions,
        # same order (tests/unit/core/test_fast_walk.py runs it against the plain walk).
        while link is not None:
            job = link.item
            nxt = link.next
            if job.blocker_tag == tag:
                link = nxt
                continue
            if job.message.more:
                peer = self._job_peer_select(job, now)
            elif job.selected_entries < job.read_entries:  # has_entries: peer_select inlined
                plink = job.peer_list.head
                while plink is not None:
                    p = plink.item
                    queue = p.queue
                    if queue.window.window > queue.busy.count and p.entries.head is not None:
                        job.peer_list.rotate(plink)
                        break
                    plink = plink.next
                if plink is None:  # no peer: a blocker, and so is each queue it waits for
                    job.blocker_tag = tag
                    plink = job.peer_list.head
                    while plink is not None:
                        p = plink.item
                        if p.entries.head is not None:
                            p.queue.blocker_tag = tag
                        plink = plink.next
                    link = nxt
                    continue
                peer = p
            else:
                peer = None
            if peer is not None:
                entry = self._entry_select(peer, now)
                job_count_slots(job)
                transport.job_current = job
                if not job.has_entries and not job.message.more:
                    job_retire(job)
                return entry
            if job.has_entries:
                job.blocker_tag = tag
                for p in job.peer_list:
                    if p.entries:
                        p.queue.blocker_tag = tag
            elif job.message.reading:
                job.read_wait = True
            else:
                job_retire(job)
            link = nxt
        transport.job_current = None
        return None

    # ------------------------------------------------------------------ fair queuing (fairq.py)
    #
    # With fairness on for a transport (``transport.fair``), selection composes nqmgr with fair
    # queuing (docs/fairness.md, "Composition"): (1) nqmgr's preemption step runs unchanged on
    # the job last selected; a job that preempts goes to the head of its flow's fair queue;
    # (2) the fair set offers its queues in increasing virtual finish time; (3) within a queue,
    # its jobs are walked in FIFO order from the queue's cursor with nqmgr's per-job rules
    # (blockers skipped, refill, read_wait, retire, round-robin peers, window check); the first
    # entry found is charged to the queue. A queue whose walk finds nothing is marked exhausted
    # at the current blocker tag and the next queue is tried; a blocker-tag bump, a new job or
    # new recipients in the queue clear the mark, exactly when nqmgr restarts its own walk.
    # The per-job rules below are the lines of _job_entry_select's loop, repeated on purpose:
    # nqmgr's own path stays byte for byte as it is (and as fast) when fairness is off.

    def _fair_entry_select(self, transport: Transport, fair: FairSet, now: float) -> Entry | None:
        """Entry selection with fair queuing between flows (the block comment above)."""
        current = transport.job_current
        if current is not None and transport.params.delivery_slot_cost >= 2:
            job_preempt(current, now)
        tag = transport.blocker_tag
        fq = fair.best(tag)
        while fq is not None:
            fj = fq.current if fq.cursor_tag == tag else None
            link = fj.link if fj is not None else fq.jobs.head
            while link is not None:
                fj = link.item
                nxt = link.next
                job = fj.job
                if job.blocker_tag != tag:
                    peer = self._job_peer_select(job, now)
                    if peer is not None:
                        entry = self._entry_select(peer, now)
                        job_count_slots(job)
                        transport.job_current = job
                        fq.current, fq.cursor_tag = fj, tag
                        entry.fair = fair.dispatch(fj, now)
                        if not job.has_entries and not job.message.more:
                            job_retire(job)
                        return entry
                    if job.has_entries:
                        job.blocker_tag = tag
                        for p in job.peer_list:
                            if p.entries:
                                p.queue.blocker_tag = tag
                    elif job.message.reading:
                        job.read_wait = True
                    else:
                        job_retire(job)
                link = nxt
            fq.exhausted_tag = tag
            fq.current = None
            fq = fair.best(tag)
        transport.job_current = None
        return None

    def _job_peer_select(self, job: Job, now: float) -> Peer | None:
        """Refill opportunistically, then pick a peer (notes §4.4)."""
        message = job.message
        p = job.transport.params
        if message.more and not message.reading and message.refcount > 0:
            spare = message.rcpt_limit - message.rcpt_count
            if spare >= p.recipient_refill_limit or (
                spare > 0 and now - message.refill_time >= p.recipient_refill_delay
            ):
                self._refill(message)
            elif spare > 0:
                due = message.refill_time + p.recipient_refill_delay
                if message.refill_timer_at != due:
                    message.refill_timer_at = due
                    self._timer_push(due, _T_REFILL, message)
        if job.has_entries:
            return peer_select(job)
        if (
            message.more
            and not message.reading
            and message.refcount > 0
            and message.rcpt_limit > message.rcpt_count
        ):
            self._refill(message)
        return None

    def _entry_select(self, peer: Peer, now: float) -> Entry:
        """Move the peer's first TODO entry to BUSY; update caching flags (notes §4.4, §10.1)."""
        link = peer.entries.head
        if link is None:
            raise InvariantError("entry_select: peer has no todo entry")
        entry = link.item
        queue = peer.queue
        peer.entries.unlink(link)
        queue.todo.unlink(entry.queue_link)
        queue.busy.append(entry.queue_link)
        entry.state = EntryState.BUSY
        peer.job.selected_entries += 1
        back_to_back = queue.last_done + 1 >= now
        if not queue.dflags & DFLAG_STORE:
            if back_to_back:
                queue.dflags |= DFLAG_LOAD | DFLAG_STORE
        elif not (queue.busy.count > 1 or back_to_back):
            queue.dflags &= ~DFLAG_STORE
        entry.dflags = queue.dflags
        return entry

    # ------------------------------------------------------------------ completion

    def entry_done(
        self,
        entry: Entry,
        *,
        hop_failure: tuple[str, str] | None = None,
        crashed: bool = False,
        now: float,
        service_time: float | None = None,
    ) -> None:
        """A delivery finished (notes §8): feedback, then dispose of the entry.

        ``service_time`` (S, seconds the delivery really took) corrects the fair-queuing charge
        by G - S (``qmgrd.core.fairq``); None leaves the guess G standing."""
        if entry.state is not EntryState.BUSY:
            raise InvariantError(f"entry_done: entry is {entry.state.value}, not busy")
        queue = entry.queue
        transport = queue.transport
        if entry.fair is not None:
            fair_complete(transport, entry, service_time, now)
        window = queue.window
        if not crashed:
            if hop_failure is not None:
                status, text = hop_failure
                if not _DSN_RE.match(status):
                    status = "4.0.0"
                dsn = (status, _SUSPENDED_PREFIX + (text or "unknown error"))
                if window.ready and window.negative_feedback():
                    self._queue_dead(queue, dsn, now)
            if transport.dead:
                self._transport_revive(transport)
            if hop_failure is None:
                queue.throttle_delay = 0.0
            if (
                hop_failure is None
                and (window.ready or window.throttled)
                and window.positive_feedback(queue.busy.count)
            ):
                self._queue_revived(queue)
        if transport.rate_locked:
            self._rate_unlock(transport, now)
        self._entry_done(entry, busy=True, now=now)

    def completes_message(self, entry: Entry) -> bool:
        """Whether ``entry_done(entry, ...)`` now reports its message done (``MessageDone``):
        the BUSY ``entry`` is the message's last live entry and no recipient is left to read.
        True holds whatever the outcome (sent, deferred, crashed), so the engine may finish the
        message's file with the entry's own file work. False may still end the message: a
        hop failure that kills the destination defers the message's other entries at once."""
        message = entry.message
        return entry.state is EntryState.BUSY and message.refcount == 1 and not message.more

    def entry_throttled(
        self,
        entry: Entry,
        *,
        kind: ThrottleKind,
        hop: tuple[str, str],
        now: float,
        observed_busy: int | None = None,
    ) -> bool:
        """A session for this BUSY entry was refused; put the entry back if the destination is
        merely full or throttling (module doc, "Learned destination limits").

        Returns True when the entry is TODO again (nothing is deferred, no feedback counted);
        False when nothing changed and the caller must call ``entry_done(hop_failure=hop)``.
        """
        if entry.state is not EntryState.BUSY:
            raise InvariantError(f"entry_throttled: entry is {entry.state.value}, not busy")
        if kind not in ("full", "rate"):
            raise InvariantError(f"entry_throttled: unknown kind {kind!r}")
        queue = entry.queue
        transport = queue.transport
        params = transport.params
        window = queue.window
        if not params.destination_concurrency_learning or not window.ready:
            return False
        others = len(queue.busy) - 1
        if observed_busy is not None:
            if observed_busy < 0:
                raise InvariantError(f"entry_throttled: observed_busy={observed_busy}")
            others = min(others, observed_busy)
        delay = 0.0
        if kind == "full":
            if others <= 0:
                return False  # nothing else gets through: a real failure
            window.settle(others)
        else:
            base = params.destination_throttle_delay
            delay = base if queue.throttle_delay <= 0.0 else 2.0 * queue.throttle_delay
            if delay <= 0.0 or delay > self.params.minimal_backoff_time:
                return False  # no pause configured, or throttled for too long: a failure
            queue.throttle_delay = delay
        self._entry_unselect(entry)
        job = entry.peer.job
        if job.stack_level < 0:
            job_obtain(entry.message, transport)  # selection retired it with its last entry
        if transport.rate_locked:
            self._rate_unlock(transport, now)
        if kind == "rate":
            window.hold(max(1, others))
            queue.resume_at = now + delay
            self._timer_push(queue.resume_at, _T_QUEUE_RESUME, queue)
        self._events.append(
            DestinationThrottled(
                transport.name,
                queue.name,
                kind,
                window.window if kind == "full" else window.resume_to,
                delay,
                hop[1],
            )
        )
        return True

    # ------------------------------------------------------------------ cluster hooks
    # The engine's destination gate (qmgrd.daemon.destgate) asks a shared destination database
    # before a delivery starts; these two calls apply its answer to the core.

    def entry_postpone(self, entry: Entry, *, until: float, now: float) -> None:
        """A BUSY entry may not start yet (cluster lease or rate refused): back to TODO, and the
        destination gives no entry before ``until``. A destination that died meanwhile defers it.
        """
        if entry.state is not EntryState.BUSY:
            raise InvariantError(f"entry_postpone: entry is {entry.state.value}, not busy")
        queue = entry.queue
        transport = queue.transport
        self._entry_unselect(entry)
        if entry.peer.job.stack_level < 0:
            job_obtain(entry.message, transport)  # selection retired it with its last entry
        if transport.rate_locked:
            self._rate_unlock(transport, now)
        window = queue.window
        if window.throttled:
            assert queue.dsn is not None
            self._defer_todo(queue, queue.dsn, now)
            return
        if window.ready:
            window.hold(window.window)
        if queue.resume_at is None or queue.resume_at < until:
            queue.resume_at = until
            self._timer_push(until, _T_QUEUE_RESUME, queue)

    def destination_hold(
        self, entry: Entry, *, dsn: tuple[str, str], until: float, now: float
    ) -> None:
        """Another node declared this BUSY entry's destination dead until ``until``: the queue
        is dead here too (its TODO entries and this one are deferred with ``dsn``) and revives
        at ``until``, as if this node had found it dead itself."""
        if entry.state is not EntryState.BUSY:
            raise InvariantError(f"destination_hold: entry is {entry.state.value}, not busy")
        queue = entry.queue
        self._entry_unselect(entry)
        if entry.peer.job.stack_level < 0:
            job_obtain(entry.message, queue.transport)
        if queue.transport.rate_locked:
            self._rate_unlock(queue.transport, now)
        window = queue.window
        if window.suspended:
            window.resume()
            queue.resume_at = None
        if window.ready:
            window.kill()
            status, text = dsn
            if not _DSN_RE.match(status):
                status = "4.0.0"
            queue.dsn = (status, _SUSPENDED_PREFIX + (text or "unknown error"))
            queue.dflags = 0
            queue.revive_at = until
            self._timer_push(until, _T_QUEUE_REVIVE, queue)
            self._events.append(
                DestinationDead(
                    queue.transport.name, queue.name, queue.nexthop, queue.dsn[0], queue.dsn[1],
                    shared=True,
                )
            )
        assert queue.dsn is not None
        self._defer_todo(queue, queue.dsn, now)

    # ------------------------------------------------------------------ end cluster hooks

    def _rate_unlock(self, transport: Transport, now: float) -> None:
        """A delivery ended: release the transport rate lock after ``transport_rate_delay``."""
        delay = transport.params.transport_rate_delay
        if delay > 0:
            transport.unlock_at = now + delay
            self._timer_push(transport.unlock_at, _T_TRANSPORT_UNLOCK, transport)
        else:
            transport.rate_locked = False

    def _entry_done(self, entry: Entry, *, busy: bool, now: float) -> None:
        """Postfix ``qmgr_entry_done`` (notes §8), for BUSY or TODO entries."""
        queue = entry.queue
        transport = queue.transport
        peer = entry.peer
        job = peer.job
        message = entry.message
        if busy:
            queue.busy.unlink(entry.queue_link)
            transport.busy -= 1
        else:
            queue.todo.unlink(entry.queue_link)
            peer.entries.unlink(entry.peer_link)
            job.selected_entries += 1
            index_touch(job)
        entry.state = EntryState.DONE
        entry.queue_link.release()
        entry.peer_link.release()
        n = len(entry.recipients)
        job.rcpt_count -= n
        message.rcpt_count -= n
        self.rcpt_count -= n

        # Slot returns (notes §6).
        for sponsor in message.jobs.values():
            if sponsor is job or sponsor.rcpt_count >= sponsor.rcpt_limit:
                continue
            if sponsor.stack_level < 0 or not message.more:
                job_move_limits(sponsor)
        if not message.more:
            job_move_limits(job)

        # Destination rate delay (notes §7.5).
        window = queue.window
        delay = transport.params.destination_rate_delay
        if busy and delay > 0:
            if window.window > 1:
                raise InvariantError(
                    f"entry_done: rate-delayed {queue.describe()} has window {window.window}"
                )
            if window.throttled:
                window.positive_feedback(len(queue.busy))
                self._queue_revived(queue)
            if window.ready:
                window.suspend()
                queue.resume_at = now + delay
                self._timer_push(queue.resume_at, _T_QUEUE_RESUME, queue)

        if not window.suspended and queue.blocker_tag == transport.blocker_tag:
            self._blocker_update(queue)

        peer.refcount -= 1
        if peer.refcount == 0:
            peer_done(peer)
        if busy:
            queue.last_done = now

        if queue.todo.head is None and queue.busy.head is None:
            if window.throttled and self.queue_count > 2 * self.params.recipient_limit:
                window.positive_feedback(0)
                self._queue_revived(queue)
            if window.ready:
                self._queue_delete(queue)

        message.refcount -= 1
        if message.refcount == 0:
            self._message_idle(message)

    def _blocker_update(self, queue: Queue) -> None:
        """Clear blocker marks when the queue can deliver again (notes §4.5)."""
        transport = queue.transport
        if queue.blocker_tag != transport.blocker_tag:
            return
        has_room = queue.window.window > len(queue.busy)
        if has_room and queue.todo:
            transport.blocker_tag += 2
            head = transport.job_list.head
            transport.job_current = head.item if head is not None else None
            transport.reset_candidate_cache()
        if has_room or queue.window.throttled:
            queue.blocker_tag = 0

    def _queue_delete(self, queue: Queue) -> None:
        """Delete an idle queue, remembering when it last completed a delivery.

        Postfix forgets everything about a destination whose queue empties, so a
        steady trickle of single-recipient mail (each message emptying the queue
        before the next arrives) never looks back-to-back and never turns on
        connection caching. Keeping ``last_done`` for a second lets the next
        queue of that name see the trickle for what it is; the window itself is
        still forgotten, as in Postfix. Measured with bench/throughput.py.
        """
        recent = queue.transport.recent_done
        if queue.window.ready and queue.last_done != float("-inf"):
            recent.pop(queue.name, None)
            recent[queue.name] = queue.last_done
            horizon = queue.last_done - 1.0
            while recent:  # oldest first (insertion order): drop what can no longer matter
                oldest = next(iter(recent))
                if recent[oldest] >= horizon:
                    break
                del recent[oldest]
        queue_done(queue)
        self.queue_count -= 1

    def _queue_dead(self, queue: Queue, dsn: tuple[str, str], now: float) -> None:
        """The window just reached 0: remember why, arm revival, defer the todo entries."""
        queue.dsn = dsn
        queue.dflags = 0
        queue.revive_at = now + self.params.minimal_backoff_time
        self._timer_push(queue.revive_at, _T_QUEUE_REVIVE, queue)
        self._events.append(
            DestinationDead(queue.transport.name, queue.name, queue.nexthop, dsn[0], dsn[1])
        )
        self._defer_todo(queue, dsn, now)

    def _queue_revived(self, queue: Queue) -> None:
        queue.dsn = None
        queue.revive_at = None
        self._events.append(DestinationRevived(queue.transport.name, queue.name))

    def _defer_todo(self, queue: Queue, dsn: tuple[str, str], now: float) -> None:
        """Report every TODO entry of ``queue`` as deferred and dispose of it."""
        for entry in list(queue.todo):
            self._events.append(
                RecipientsDeferred(entry.message, tuple(entry.recipients), dsn[0], dsn[1])
            )
            self._entry_done(entry, busy=False, now=now)

    def transport_failed(
        self, name: str, dsn: str, reason: str, now: float, *, entry: Entry | None = None
    ) -> None:
        """An agent for ``name`` could not run: the transport is dead (notes §4.2, §7.4)."""
        transport = self._transport_obtain(name)
        if entry is not None:
            self._entry_unselect(entry)
        transport.dead = True
        transport.dsn = (dsn, reason)
        transport.rate_locked = False
        transport.unlock_at = None
        transport.revive_at = now + self.params.transport_retry_time
        self._timer_push(transport.revive_at, _T_TRANSPORT_REVIVE, transport)
        self._events.append(TransportDead(name, dsn, reason))
        for queue in list(transport.queues.values()):
            self._defer_todo(queue, transport.dsn, now)

    def _entry_unselect(self, entry: Entry) -> None:
        """BUSY back to TODO, keeping the order (notes §4.4): todo tail, peer head."""
        if entry.state is not EntryState.BUSY:
            raise InvariantError(f"entry_unselect: entry is {entry.state.value}, not busy")
        queue = entry.queue
        queue.busy.unlink(entry.queue_link)
        queue.todo.append(entry.queue_link)
        entry.peer.entries.prepend(entry.peer_link)
        entry.peer.job.selected_entries -= 1
        entry.state = EntryState.TODO
        queue.transport.busy -= 1
        if entry.fair is not None:
            fair_complete(queue.transport, entry, None, None)

    def _transport_revive(self, transport: Transport) -> None:
        transport.dead = False
        transport.dsn = None
        transport.revive_at = None
        self._events.append(TransportRevived(transport.name))

    # ------------------------------------------------------------------ events and timers

    def pop_events(self) -> list[Event]:
        """Drain the events reported since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    def _timer_push(self, deadline: float, kind: int, obj: _TimerObj) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, kind, obj))

    @staticmethod
    def _timer_live(deadline: float, kind: int, obj: _TimerObj) -> bool:
        if kind == _T_QUEUE_REVIVE:
            assert isinstance(obj, Queue)
            return not obj.deleted and obj.revive_at == deadline
        if kind == _T_QUEUE_RESUME:
            assert isinstance(obj, Queue)
            return not obj.deleted and obj.resume_at == deadline
        if kind == _T_TRANSPORT_REVIVE:
            assert isinstance(obj, Transport)
            return obj.dead and obj.revive_at == deadline
        if kind == _T_TRANSPORT_UNLOCK:
            assert isinstance(obj, Transport)
            return obj.rate_locked and obj.unlock_at == deadline
        assert isinstance(obj, Message)
        return not obj.finished and obj.refill_timer_at == deadline

    def next_deadline(self) -> float | None:
        """The earliest time ``run_timers`` has something to do, or None."""
        timers = self._timers
        while timers and not self._timer_live(timers[0][0], timers[0][2], timers[0][3]):
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def run_timers(self, now: float) -> None:
        """Fire every timer due at ``now``."""
        timers = self._timers
        while timers and timers[0][0] <= now:
            deadline, _, kind, obj = heapq.heappop(timers)
            if not self._timer_live(deadline, kind, obj):
                continue
            if kind == _T_QUEUE_REVIVE:
                assert isinstance(obj, Queue)
                obj.revive_at = None
                self._queue_unthrottle(obj)
            elif kind == _T_QUEUE_RESUME:
                assert isinstance(obj, Queue)
                obj.resume_at = None
                obj.window.resume()
                if not obj.todo and not obj.busy:
                    self._queue_delete(obj)
                else:
                    self._blocker_update(obj)
            elif kind == _T_TRANSPORT_REVIVE:
                assert isinstance(obj, Transport)
                self._transport_revive(obj)
            elif kind == _T_TRANSPORT_UNLOCK:
                assert isinstance(obj, Transport)
                obj.rate_locked = False
                obj.unlock_at = None
            else:
                assert isinstance(obj, Message)
                obj.refill_timer_at = None
                if (
                    obj.more
                    and not obj.reading
                    and obj.refcount > 0
                    and obj.rcpt_limit > obj.rcpt_count
                ):
                    self._refill(obj)

    def _queue_unthrottle(self, queue: Queue) -> None:
        """Revive a dead queue (timer or flush); delete it if it is empty."""
        window = queue.window
        if window.throttled:
            window.positive_feedback(len(queue.busy))
            self._queue_revived(queue)
            self._blocker_update(queue)
        if window.ready and not queue.todo and not queue.busy:
            self._queue_delete(queue)

    # ------------------------------------------------------------------ flush

    def flush(self, now: float) -> None:
        """Forget dead transports and destinations (``postqueue -f``, notes §3.1)."""
        for transport in self._transport_list:
            if transport.dead:
                self._transport_revive(transport)
            for queue in list(transport.queues.values()):
                self._queue_unthrottle(queue)

    def flush_destination(self, name: str, now: float) -> None:
        """Forget that the destination queues named ``name`` are dead (fast flush)."""
        for transport in self._transport_list:
            queue = transport.queues.get(name)
            if queue is not None:
                self._queue_unthrottle(queue)
