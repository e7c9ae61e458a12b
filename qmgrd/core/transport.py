"""Transports: one per master.cf service seen in resolver output (notes §2.1, §4.1, §7.4-5).

Contract
--------
A :class:`Transport` owns its destination queues (by name), its jobs in scheduler order
(``job_list``) and in strict ``queued_time`` order (``job_bytime``), the recipient-slot pool
(``rcpt_unused``, which may go negative through the stack reserve), the blocker tag (odd, bumped by
2 to clear every blocker mark at once), the preemption candidate cache and ``job_index``, the
mirror of ``job_list`` that the candidate search walks (:mod:`qmgrd.core.jobindex`). Transports
are created the first time a recipient resolves to them and never freed.

States: ``dead`` (agent failures; ``dsn`` holds the reason; revived after
``transport_retry_time``, on any completed delivery, or on flush) and ``rate_locked``
(``transport_rate_delay``: one selection at a time, released ``transport_rate_delay`` seconds after
the delivery completes). ``busy`` counts entries handed to agents: the transport is at its process
limit when ``busy >= process_limit`` (0 = unlimited).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from qmgrd.core.dll import DList, Link
from qmgrd.core.jobindex import JobIndex

if TYPE_CHECKING:
    from qmgrd.core.fairq import FairSet
    from qmgrd.core.job import Job
    from qmgrd.core.params import TransportParams
    from qmgrd.core.queue import Queue

__all__ = ["Transport"]


@dataclass(slots=True, eq=False)
class Transport:
    """One delivery transport and everything queued for it."""

    name: str
    params: TransportParams
    rcpt_unused: int  # recipient-slot pool; starts at params.recipient_limit
    queues: dict[str, Queue] = field(default_factory=dict)
    job_list: DList[Job] = field(default_factory=DList)  # scheduler order
    job_bytime: DList[Job] = field(default_factory=DList)  # queued_time order
    job_index: JobIndex = field(default_factory=JobIndex)  # job_list for the candidate search
    job_current: Job | None = None
    job_next_unread: Job | None = None
    candidate_cache: Job | None = None
    candidate_cache_current: Job | None = None
    candidate_cache_time: int = 0
    blocker_tag: int = 1
    busy: int = 0  # entries handed to agents
    dead: bool = False
    dsn: tuple[str, str] | None = None  # (status, reason) while dead
    rate_locked: bool = False
    revive_at: float | None = None  # dead timer deadline
    unlock_at: float | None = None  # rate-lock release deadline
    # last_done of READY queues deleted when they went idle, oldest first, kept about a second:
    # a queue re-created moments later still detects back-to-back deliveries (see
    # Scheduler._queue_delete; a measured difference from Postfix, DESIGN §9).
    recent_done: dict[str, float] = field(default_factory=dict)
    fair: FairSet | None = None  # fair queuing between flows (qmgrd.core.fairq); None = off
    link: Link[Transport] = field(init=False)  # on the scheduler's round-robin list

    def __post_init__(self) -> None:
        """Create the round-robin link."""
        self.link = Link(self)

    def reset_candidate_cache(self) -> None:
        """Forget the cached preemption candidate (notes §5.3)."""
        self.candidate_cache_current = None

    @property
    def at_process_limit(self) -> bool:
        """True when every agent slot is in use."""
        limit = self.params.process_limit
        return limit > 0 and self.busy >= limit
