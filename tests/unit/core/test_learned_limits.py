"""``Scheduler.entry_throttled`` and the window's ``settle`` / ``hold``: table-driven steps."""

from __future__ import annotations

import pytest

from qmgrd.core import Entry, RecipientsDeferred, SchedulerParams, TransportParams
from qmgrd.core.events import DestinationThrottled
from qmgrd.core.feedback import ConcurrencyWindow, Feedback
from qmgrd.errors import InvariantError
from tests.unit.core.schedsim import Sim

HOP = ("4.7.0", "421 4.7.0 Too many concurrent sessions")
ONE_OVER_N = Feedback(1.0, "concurrency")


def _sim(*, learning: bool = True, delay: float = 10.0, backoff: float = 300.0) -> Sim:
    params = TransportParams(
        initial_destination_concurrency=5,
        destination_recipient_limit=1,
        positive_feedback=ONE_OVER_N,
        negative_feedback=ONE_OVER_N,
        destination_concurrency_learning=learning,
        destination_throttle_delay=delay,
    )
    sim = Sim({"smtp": params}, SchedulerParams(minimal_backoff_time=backoff))
    sim.add("m", [("smtp", "dst")] * 8)
    return sim


def _select_all(sim: Sim) -> list[Entry]:
    out = []
    while (entry := sim.sched.select(sim.now)) is not None:
        out.append(entry)
    return out


def test_full_while_others_work_puts_entry_back_and_settles() -> None:
    """A refusal with 4 others working: the entry is TODO again, the window is 4, nothing is
    deferred or counted toward dead, and the entry is handed out again when a session frees."""
    sim = _sim()
    busy = _select_all(sim)
    assert len(busy) == 5
    refused = busy.pop()
    assert sim.sched.entry_throttled(refused, kind="full", hop=HOP, now=sim.now)
    queue = refused.queue
    assert (queue.window.window, len(queue.busy), len(queue.todo)) == (4, 4, 4)
    assert refused.state.value == "todo"
    assert queue.window.fail_cohorts == 0.0
    events = sim.drain_events()
    assert not any(isinstance(e, RecipientsDeferred) for e in events)
    assert [e for e in events if isinstance(e, DestinationThrottled)] == [
        DestinationThrottled("smtp", "dst", "full", 4, 0.0, HOP[1])
    ]
    assert sim.sched.select(sim.now) is None  # full: wait for a session to free
    sim.sched.entry_done(busy.pop(), now=sim.now)
    assert sim.sched.select(sim.now) is refused  # back at the head of its peer


def test_full_with_nothing_else_working_is_a_failure() -> None:
    """With no other session working the refusal is a real failure: False, nothing changed."""
    sim = _sim()
    first, *others = _select_all(sim)
    for entry in others:
        sim.sched.entry_done(entry, now=sim.now)
    assert list(first.queue.busy) == [first]
    before = first.queue.window.window
    assert not sim.sched.entry_throttled(first, kind="full", hop=HOP, now=sim.now)
    assert first.state.value == "busy" and first.queue.window.window == before


def test_learning_off_changes_nothing() -> None:
    """``destination_concurrency_learning = no``: False and the state is untouched (Postfix)."""
    sim = _sim(learning=False)
    busy = _select_all(sim)
    assert not sim.sched.entry_throttled(busy[-1], kind="full", hop=HOP, now=sim.now)
    assert busy[-1].state.value == "busy" and busy[-1].queue.window.window == 5


def test_rate_throttle_pauses_doubling_then_resets_on_success() -> None:
    """A throttling reply pauses the destination for 10 s, then 20 s; the window comes back at
    the number that was working; a successful delivery resets the pause to 10 s."""
    sim = _sim(delay=10.0)
    busy = _select_all(sim)
    queue = busy[0].queue
    assert sim.sched.entry_throttled(busy.pop(), kind="rate", hop=HOP, now=sim.now)
    assert queue.window.suspended and queue.resume_at == sim.now + 10.0
    assert sim.sched.select(sim.now) is None
    for entry in busy:
        sim.sched.entry_done(entry, now=sim.now)  # no feedback while paused
    assert queue.throttle_delay == 0.0  # a success resets the pause length
    sim.now += 10.0
    sim.sched.run_timers(sim.now)
    assert queue.window.window == 4
    again = _select_all(sim)
    assert len(again) == 4
    assert sim.sched.entry_throttled(again.pop(), kind="rate", hop=HOP, now=sim.now)
    assert queue.resume_at == sim.now + 10.0 and queue.window.resume_to == 3
    sim.now += 10.0
    sim.sched.run_timers(sim.now)
    assert sim.sched.select(sim.now) is None  # three still busy, window 3
    first = again.pop()
    assert sim.sched.entry_throttled(first, kind="rate", hop=HOP, now=sim.now)
    assert queue.resume_at == sim.now + 20.0  # doubled: no success in between


def test_rate_throttle_beyond_backoff_is_a_failure() -> None:
    """When the next pause would exceed minimal_backoff_time the throttle is a failure (False),
    so a server that never stops throttling cannot keep mail in the active queue."""
    sim = _sim(delay=10.0, backoff=15.0)
    busy = _select_all(sim)
    queue = busy[0].queue
    assert sim.sched.entry_throttled(busy.pop(), kind="rate", hop=HOP, now=sim.now)
    sim.now += 10.0
    sim.sched.run_timers(sim.now)
    assert not sim.sched.entry_throttled(busy[0], kind="rate", hop=HOP, now=sim.now)
    assert queue.throttle_delay == 10.0


def test_entry_throttled_rejects_a_todo_entry() -> None:
    """Throttling an entry that is not busy is a bug."""
    sim = _sim()
    busy = _select_all(sim)
    assert sim.sched.entry_throttled(busy[-1], kind="full", hop=HOP, now=sim.now)
    with pytest.raises(InvariantError, match="not busy"):
        sim.sched.entry_throttled(busy[-1], kind="full", hop=HOP, now=sim.now)


@pytest.mark.parametrize(("window", "observed", "after"), [(6, 5, 5), (3, 5, 3), (4, 0, 1)])
def test_settle_never_raises_the_window(window: int, observed: int, after: int) -> None:
    """``settle`` takes min(window, observed), at least 1, and clears the accumulators only."""
    w = ConcurrencyWindow(
        init=window, limit=20, positive=ONE_OVER_N, negative=ONE_OVER_N, cohort_limit=1
    )
    w.success, w.failure, w.fail_cohorts = 0.5, 0.5, 0.25
    w.settle(observed)
    assert (w.window, w.success, w.failure, w.fail_cohorts) == (after, 0.0, 0.0, 0.25)


def test_hold_and_resume_restore_the_held_window() -> None:
    """``hold(3)`` on window 5 suspends and ``resume`` gives 3; ``suspend`` still resumes at 1."""
    w = ConcurrencyWindow(
        init=5, limit=20, positive=ONE_OVER_N, negative=ONE_OVER_N, cohort_limit=1
    )
    w.hold(3)
    assert w.suspended
    w.resume()
    assert w.window == 3
    w.window = 1
    w.suspend()
    w.resume()
    assert w.window == 1
    with pytest.raises(InvariantError, match="hold of a suspended"):
        w.suspend()
        w.hold(2)
