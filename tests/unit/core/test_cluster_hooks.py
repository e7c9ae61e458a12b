"""``Scheduler.entry_postpone`` and ``destination_hold``: the cluster gate's answers applied
to the core (qmgrd.daemon.destgate), as table-driven steps."""

from __future__ import annotations

import pytest

from qmgrd.core import RecipientsDeferred, SchedulerParams, TransportParams
from qmgrd.core.events import DestinationDead, DestinationRevived
from qmgrd.errors import InvariantError
from tests.unit.core.schedsim import Sim

DSN = ("4.4.1", "connect to dst: Connection refused")


def _sim(backoff: float = 300.0) -> Sim:
    params = TransportParams(initial_destination_concurrency=3, destination_recipient_limit=1)
    sim = Sim({"smtp": params}, SchedulerParams(minimal_backoff_time=backoff))
    sim.add("m", [("smtp", "dst")] * 6)
    return sim


def test_postpone_puts_the_entry_back_and_holds_the_destination_until_the_time() -> None:
    """A postponed entry is TODO again at the head of its peer; the destination hands out
    nothing until ``until``, then resumes at its window; nothing is deferred."""
    sim = _sim()
    busy = sim.select_all()
    assert len(busy) == 3
    refused = busy.pop()
    sim.sched.entry_postpone(refused, until=sim.now + 0.1, now=sim.now)
    queue = refused.queue
    assert refused.state.value == "todo" and queue.window.suspended
    assert sim.sched.next_deadline() == pytest.approx(sim.now + 0.1)
    sim.sched.entry_done(busy.pop(), now=sim.now)
    assert sim.sched.select(sim.now) is None  # held even though a session freed
    sim.now += 0.1
    sim.sched.run_timers(sim.now)
    assert queue.window.window == 3
    assert sim.sched.select(sim.now) is refused
    assert not any(isinstance(e, RecipientsDeferred) for e in sim.drain_events())


def test_postpone_keeps_the_later_resume_time() -> None:
    """Two postponements: the destination waits for the later of the two times."""
    sim = _sim()
    first, second, _ = sim.select_all()
    sim.sched.entry_postpone(first, until=sim.now + 2.0, now=sim.now)
    sim.sched.entry_postpone(second, until=sim.now + 0.5, now=sim.now)
    assert first.queue.resume_at == sim.now + 2.0


def test_postpone_at_a_destination_that_died_meanwhile_defers_the_entry() -> None:
    """The destination died while the gate was asked: the entry is deferred with its reason."""
    sim = _sim()
    entry, *others = sim.select_all()
    for other in others:  # 1/3 of a cohort, then window 1 and a whole one: dead
        sim.sched.entry_done(other, hop_failure=DSN, now=sim.now)
    assert entry.queue.window.throttled
    sim.drain_events()
    sim.sched.entry_postpone(entry, until=sim.now + 0.1, now=sim.now)
    assert entry.state.value == "done"
    deferred = [e for e in sim.drain_events() if isinstance(e, RecipientsDeferred)]
    assert sum(len(e.recipients) for e in deferred) == 1


def test_hold_makes_the_destination_dead_here_until_the_shared_revival() -> None:
    """Another node's dead verdict: this entry and the TODO entries are deferred with the
    verdict's reason, the queue is dead (a shared DestinationDead), and revives at ``until``."""
    sim = _sim()
    entry, *running = sim.select_all()
    sim.sched.destination_hold(entry, dsn=DSN, until=sim.now + 42.0, now=sim.now)
    queue = entry.queue
    assert queue.window.throttled and queue.revive_at == sim.now + 42.0
    events = sim.drain_events()
    dead = [e for e in events if isinstance(e, DestinationDead)]
    assert len(dead) == 1 and dead[0].shared and dead[0].status == "4.4.1"
    deferred = [e for e in events if isinstance(e, RecipientsDeferred)]
    assert sum(len(e.recipients) for e in deferred) == 4  # this one and the three TODO
    assert all(e.reason.endswith(DSN[1]) for e in deferred)
    for other in running:
        sim.sched.entry_done(other, now=sim.now)
    sim.now += 42.0
    sim.sched.run_timers(sim.now)
    assert any(isinstance(e, DestinationRevived) for e in sim.drain_events())


def test_hooks_reject_a_todo_entry() -> None:
    """Both hooks take BUSY entries only: anything else is a bug."""
    sim = _sim()
    entry = sim.select_all()[0]
    sim.sched.entry_postpone(entry, until=sim.now + 1.0, now=sim.now)
    with pytest.raises(InvariantError):
        sim.sched.entry_postpone(entry, until=sim.now + 1.0, now=sim.now)
    with pytest.raises(InvariantError):
        sim.sched.destination_hold(entry, dsn=DSN, until=sim.now + 1.0, now=sim.now)
