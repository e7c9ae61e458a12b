"""The scheduler's inlined job walk makes exactly the choices of the plain one (Postfix's loop).

``Scheduler._job_entry_select`` inlines ``_job_peer_select``/``peer_select`` for jobs whose
message has nothing left to read. ``plain_walk`` below is the walk as it was written before,
call for call; both run the same random workloads (preemption, refills, blockers, dead and
throttled destinations) and must make the same selections in the same order.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings

from qmgrd.core.dll import Link
from qmgrd.core.job import Job, job_count_slots, job_preempt, job_retire
from qmgrd.core.scheduler import Scheduler
from qmgrd.core.transport import Transport
from tests.unit.core.test_candidate_index import SETTINGS, Workload, run, workloads


def plain_walk(self: Scheduler, transport: Transport, now: float) -> object:
    """Postfix's ``qmgr_job_entry_select`` loop, without the inlining (the reference)."""
    job = transport.job_current
    if job is None:
        return None
    if transport.params.delivery_slot_cost >= 2:
        job = job_preempt(job, now)
    tag = transport.blocker_tag
    link: Link[Job] | None = job.transport_link
    while link is not None:
        job = link.item
        nxt = link.next
        if job.blocker_tag == tag:
            link = nxt
            continue
        peer = self._job_peer_select(job, now)
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


@pytest.mark.slow
@settings(SETTINGS, max_examples=150)
@given(workloads())
def test_inlined_walk_equals_plain_walk(work: Workload) -> None:
    """Every selection of a whole run is the same with the inlined walk and the plain one."""
    fast = run(work)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Scheduler, "_job_entry_select", plain_walk)
        plain = run(work)
    assert fast == plain

