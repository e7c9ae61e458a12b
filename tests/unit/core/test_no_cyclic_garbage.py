"""Disposed core objects are freed by reference counting, not left for the cyclic GC."""

from __future__ import annotations

import gc
from collections import Counter

import pytest

from qmgrd.core import Entry, SchedulerParams, TransportParams
from qmgrd.core.flow import Flow
from tests.unit.core.schedsim import Sim


def _workload(sim: Sim) -> None:
    """Preemption, a dead destination, a crash, a dead transport and refills, to completion."""
    sim.add("big", [("smtp", f"d{i % 7}") for i in range(60)], queued_time=sim.now - 50)
    for i in range(12):
        flow = Flow(f"sender:s{i % 3}")  # ignored where fairness is off
        sim.add(f"s{i}", [("smtp", "d1"), ("relay", "bad"), ("smtp", f"x{i}")], flow=flow)
    busy: list[Entry] = []
    failed_relay = False
    for step in range(5000):
        sim.serve_reads()
        entry = sim.sched.select(sim.now)
        if entry is not None:
            if entry.transport == "relay" and not failed_relay:
                failed_relay = True
                sim.sched.transport_failed("relay", "4.3.0", "agent died", sim.now, entry=entry)
            else:
                busy.append(entry)
            continue
        if busy:
            done = busy.pop(step % len(busy))
            hop = ("4.4.1", "refused") if done.queue.name == "bad" else None
            sim.sched.entry_done(done, hop_failure=hop, crashed=step % 13 == 0, now=sim.now)
        elif sim.sched.message_count == 0:
            break
        else:
            sim.now = max(sim.now + 1.0, sim.sched.next_deadline() or 0.0)
            sim.sched.run_timers(sim.now)
        sim.drain_events()
    assert sim.sched.message_count == 0


@pytest.mark.parametrize("fairness", [False, True])
def test_finished_messages_leave_no_cyclic_garbage(fairness: bool) -> None:
    """After a workload runs to completion with the GC off, a collection finds no core objects
    (fair queuing on or off)."""
    params = TransportParams(
        fairness=fairness,
        process_limit=4,
        destination_concurrency_limit=2,
        destination_recipient_limit=2,
        delivery_slot_cost=2,
        minimum_delivery_slots=1,
        recipient_limit=40,
    )
    sim = Sim(
        {"smtp": params, "relay": params},
        SchedulerParams(qmgr_message_recipient_limit=30, minimal_backoff_time=5.0),
    )
    gc.collect()
    gc.disable()
    try:
        _workload(sim)
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        garbage = Counter(
            type(obj).__qualname__
            for obj in gc.garbage
            if type(obj).__module__.startswith("qmgrd.")
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert sim.events, "the workload ran"
    assert not garbage, f"cyclic garbage left by the core: {dict(garbage)}"
