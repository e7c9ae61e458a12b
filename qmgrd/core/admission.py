"""Fair admission into the active queue: which waiting queue file is loaded next (issue 15).

Theory of operation (seed: APF queueset fair queuing, adapted to admission)
---------------------------------------------------------------------------
Postfix loads ``incoming/`` and the due part of ``deferred/`` into the active
queue in arrival order, alternating the two (notes §1). With a backlog of
100,000 messages from one sender in ``incoming/``, a message from anyone else
waits behind all of them just to be loaded. :class:`Admission` keeps the
waiting queue ids per :class:`~qmgrd.core.flow.Flow` (two FIFOs per flow:
incoming and deferred) and picks the next flow by weighted fair queuing with
self-clocked virtual time:

- every admission costs one unit of service; a flow of weight ``w`` advances
  its virtual finish tag by ``1 / w`` per admitted message;
- the flow with the smallest finish tag goes next (a heap: O(log F) per
  admission for F backlogged flows, ties in order of arrival);
- virtual time ``V`` is the finish tag of the last admission; a flow that
  becomes backlogged starts at ``max(V, its last tag) + 1 / w``, so an idle
  flow gains no credit and a new flow is served within one round;
- once the flow is chosen, its incoming or deferred head goes as Postfix's
  ``qmgr_active_feed`` alternates them: one alternation across all
  admissions (incoming after a deferred one, and incoming again when the
  active queue is full after this message); a flow with only one kind
  waiting takes that one.

With fairness ``none`` every message has ``FLOW_NONE``: one flow, so the order
is exactly Postfix's (and today's) — ``test_admission`` pins it.

Optional per-flow limits (:class:`FlowLimits`; 0 = none):

- ``active_limit``: at most that many admitted messages of one flow in the
  active queue at once; the flow waits ("capped") until :meth:`release`;
- ``rate`` / ``burst``: a GCRA (``qmgrd.core.gcra``) on the flow's
  admissions; a flow over its rate waits ("paced") until
  :meth:`next_deadline`;
- ``backlog_limit``: :meth:`over_backlog` says a flow has that many
  messages waiting; intake refuses new mail of that flow (``452 4.3.2``).

Costs: O(1) per waiting id (a deque entry and a dict entry), O(log F) per
admission, O(1) :meth:`remove` (lazy: the deque entry is dropped when it
reaches the head, or at once when the flow has nothing else waiting). A flow's
state is forgotten when nothing of it waits or is admitted, so memory is
bounded by the waiting ids plus the admitted messages.

Sans-IO: time is an argument; nothing here reads a clock or a file.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass, field

from qmgrd.core.flow import Flow
from qmgrd.core.gcra import Gcra
from qmgrd.errors import InvariantError

__all__ = ["SOURCES", "Admission", "FlowBacklog", "FlowLimits"]

SOURCES = ("incoming", "deferred")  # where a waiting message is loaded from
_INCOMING, _DEFERRED = 0, 1

_IDLE, _READY, _CAPPED, _PACED = "idle", "ready", "capped", "paced"


@dataclass(frozen=True, slots=True)
class FlowLimits:
    """Per-flow limits on admission (0 = no limit; see the module doc)."""

    active_limit: int = 0
    rate: float = 0.0  # admitted messages per second
    burst: float = 1.0  # admitted back to back at most (with a rate)
    backlog_limit: int = 0

    def __post_init__(self) -> None:
        if min(self.active_limit, self.backlog_limit) < 0 or self.rate < 0.0:
            raise InvariantError(f"negative flow limit in {self}")
        if self.burst < 1.0:
            raise InvariantError(f"flow burst {self.burst} is below 1")


@dataclass(frozen=True, slots=True)
class FlowBacklog:
    """One flow's line in status and metrics."""

    label: str
    waiting: int
    active: int


@dataclass(slots=True, eq=False)
class _FlowQueue:
    """One flow's waiting ids and admission state."""

    flow: Flow
    fifos: tuple[deque[tuple[str, int]], deque[tuple[str, int]]] = field(
        default_factory=lambda: (deque(), deque())
    )
    live: list[int] = field(default_factory=lambda: [0, 0])  # valid entries per fifo
    finish: float = 0.0  # virtual finish tag of the next admission (state READY)
    active: int = 0  # admitted and not released
    state: str = _IDLE
    gcra: Gcra | None = None

    @property
    def waiting(self) -> int:
        return self.live[_INCOMING] + self.live[_DEFERRED]


class Admission:
    """The waiting queue ids by flow and the fair choice among them (see the module doc)."""

    def __init__(self, limits: FlowLimits | None = None) -> None:
        """No waiting ids; ``limits``: per-flow limits (default: none)."""
        self.limits = limits or FlowLimits()
        self._flows: dict[str, _FlowQueue] = {}
        self._where: dict[str, tuple[_FlowQueue, int, int]] = {}  # id -> (flow, fifo, token)
        self._ready: list[tuple[float, int, _FlowQueue]] = []  # (finish, seq, flow)
        self._paced: list[tuple[float, int, _FlowQueue]] = []  # (allowed at, seq, flow)
        self._seq = itertools.count()
        self._vtime = 0.0
        self._prefer_incoming = True  # Postfix's alternation, across all admissions

    # ------------------------------------------------------------------ queries

    def __len__(self) -> int:
        """Queue ids waiting."""
        return len(self._where)

    def __contains__(self, queue_id: object) -> bool:
        """Whether ``queue_id`` is waiting."""
        return queue_id in self._where

    def backlog(self, key: str) -> int:
        """Messages of flow ``key`` waiting for the active queue."""
        fq = self._flows.get(key)
        return 0 if fq is None else fq.waiting

    def over_backlog(self, key: str) -> bool:
        """Whether flow ``key`` has ``backlog_limit`` or more messages waiting (intake 452)."""
        limit = self.limits.backlog_limit
        return limit > 0 and self.backlog(key) >= limit

    def over_backlog_keys(self) -> frozenset[str]:
        """Every flow key ``over_backlog`` (for listener worker processes' intake gates)."""
        limit = self.limits.backlog_limit
        if limit <= 0:
            return frozenset()
        return frozenset(k for k, fq in self._flows.items() if fq.waiting >= limit)

    def next_deadline(self) -> float | None:
        """When the earliest paced flow may be admitted again (None: no paced flow)."""
        return self._paced[0][0] if self._paced else None

    def backlogs(self, top: int) -> tuple[FlowBacklog, ...]:
        """The ``top`` flows by waiting messages (then admitted), the rest summed as ``other``."""
        rows = sorted(
            (fq for fq in self._flows.values() if fq.waiting or fq.active),
            key=lambda fq: (-fq.waiting, -fq.active, fq.flow.label),
        )
        out = [FlowBacklog(fq.flow.label, fq.waiting, fq.active) for fq in rows[:top]]
        rest = rows[top:]
        if rest:
            out.append(
                FlowBacklog(
                    "other", sum(fq.waiting for fq in rest), sum(fq.active for fq in rest)
                )
            )
        return tuple(out)

    # ------------------------------------------------------------------ changes

    def add(self, queue_id: str, source: str, flow: Flow) -> None:
        """``queue_id`` waits in ``source`` (incoming | deferred) as a message of ``flow``."""
        if queue_id in self._where:
            raise InvariantError(f"{queue_id}: already waiting for the active queue")
        if source not in SOURCES:
            raise InvariantError(f"{queue_id}: cannot wait in {source!r}")
        fq = self._flows.get(flow.key)
        if fq is None:
            fq = self._flows[flow.key] = _FlowQueue(flow)
        elif fq.flow is not flow and fq.flow != flow:  # (identity first: no __eq__ call)
            fq.flow = flow  # the weight or tenant changed (reload)
        index = SOURCES.index(source)
        token = next(self._seq)
        fq.fifos[index].append((queue_id, token))
        fq.live[index] += 1
        self._where[queue_id] = (fq, index, token)
        if fq.state == _IDLE:
            self._schedule(fq)

    def remove(self, queue_id: str) -> bool:
        """Forget a waiting ``queue_id`` (an operator took it); False if it was not waiting."""
        found = self._where.pop(queue_id, None)
        if found is None:
            return False
        fq, index, _token = found
        fq.live[index] -= 1
        if fq.waiting == 0:
            fq.fifos[_INCOMING].clear()  # every entry left is stale
            fq.fifos[_DEFERRED].clear()
        return True

    def next(self, room: bool, now: float) -> tuple[str, str, Flow] | None:
        """The next (queue id, source, flow) to load, counted as admitted; None if none may go.

        ``room``: whether the active queue has room after this one (when it is
        full, the flow's incoming gets its next slot, as in Postfix).
        """
        self.wake(now)
        while self._ready:
            finish, _seq, fq = heapq.heappop(self._ready)
            fq.state = _IDLE
            live = fq.live
            if live[0] + live[1] == 0:  # fq.waiting, inlined (every load)
                self._forget_if_unused(fq)
                continue
            if self._capped(fq):
                fq.state = _CAPPED
                fq.finish = finish - 1.0 / fq.flow.weight  # not admitted: _schedule adds it
                continue
            if fq.gcra is not None and not fq.gcra.conforms(now):
                fq.finish = finish - 1.0 / fq.flow.weight
                fq.state = _PACED
                heapq.heappush(self._paced, (fq.gcra.allowed_at(now), next(self._seq), fq))
                continue
            queue_id, source = self._pop(fq, room)
            self._vtime = max(self._vtime, finish)
            fq.active += 1
            if fq.gcra is not None:
                fq.gcra.take(now)
            fq.finish = finish
            live = fq.live
            if live[0] + live[1]:  # fq.waiting
                self._schedule(fq)
            return queue_id, source, fq.flow
        return None

    def release(self, flow: Flow) -> None:
        """An admitted message of ``flow`` left the active queue (or never got there)."""
        fq = self._flows.get(flow.key)
        if fq is None or fq.active <= 0:
            raise InvariantError(f"flow {flow.label!r}: released more messages than admitted")
        fq.active -= 1
        if fq.state == _CAPPED and not self._capped(fq):
            self._schedule(fq)
        else:
            self._forget_if_unused(fq)

    def wake(self, now: float) -> None:
        """Paced flows whose time has come compete again."""
        while self._paced and self._paced[0][0] <= now:
            _at, _seq, fq = heapq.heappop(self._paced)
            fq.state = _IDLE
            self._schedule(fq)

    def set_limits(self, limits: FlowLimits) -> None:
        """New limits (reload): every held-back flow competes again under them."""
        self.limits = limits
        held = [fq for fq in self._flows.values() if fq.state in (_CAPPED, _PACED)]
        self._paced.clear()
        for fq in self._flows.values():
            fq.gcra = None
        for fq in held:
            fq.state = _IDLE
            self._schedule(fq)

    # ------------------------------------------------------------------ internals

    def _capped(self, fq: _FlowQueue) -> bool:
        limit = self.limits.active_limit
        return limit > 0 and fq.active >= limit

    def _schedule(self, fq: _FlowQueue) -> None:
        """Put a flow with waiting ids among the ready flows (its next finish tag)."""
        live = fq.live
        if live[0] + live[1] == 0:  # fq.waiting
            fq.state = _IDLE
            self._forget_if_unused(fq)
            return
        if self.limits.rate > 0.0 and fq.gcra is None:
            fq.gcra = Gcra(self.limits.rate, self.limits.burst)
        fq.finish = max(fq.finish, self._vtime) + 1.0 / fq.flow.weight
        fq.state = _READY
        heapq.heappush(self._ready, (fq.finish, next(self._seq), fq))

    def _pop(self, fq: _FlowQueue, room: bool) -> tuple[str, str]:
        """The flow's next live id: incoming and deferred alternate (notes §1)."""
        incoming = fq.live[_INCOMING] > 0
        deferred = fq.live[_DEFERRED] > 0
        prefer = self._prefer_incoming
        index = _DEFERRED if deferred and (not incoming or not prefer) else _INCOMING
        fifo = fq.fifos[index]
        while fifo:
            queue_id, token = fifo.popleft()
            found = self._where.get(queue_id)
            if found is not None and found[0] is fq and found[2] == token:
                del self._where[queue_id]
                fq.live[index] -= 1
                self._prefer_incoming = index == _DEFERRED or not room
                return queue_id, SOURCES[index]
        raise InvariantError(f"flow {fq.flow.label!r}: counted waiting ids that are not queued")

    def _forget_if_unused(self, fq: _FlowQueue) -> None:
        live = fq.live
        unused = live[0] + live[1] == 0 and fq.active == 0 and fq.state == _IDLE  # waiting
        if unused and self._flows.get(fq.flow.key) is fq:
            del self._flows[fq.flow.key]
