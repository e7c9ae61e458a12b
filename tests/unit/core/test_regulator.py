"""The workqueue regulator's decisions, step by step, time passed in (seeds/pthread-workqueue)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.core.regulator import QUIET_PERIOD, Grow, Next, Regulator
from qmgrd.errors import InvariantError

T0 = 1000.0


def _state(r: Regulator) -> tuple[int, int, int, int, int]:
    return r.running, r.blocked, r.waiting, r.parked, r.queued


def _pool(target: int = 2, limit: int = 4) -> Regulator:
    """A pool at its base size: ``target`` workers waiting, nothing queued."""
    r = Regulator(target=target, limit=limit)
    r.submitted(T0, target)
    for _ in range(target):
        assert r.grow(T0) is Grow.SPAWN
        r.started(T0)
    assert r.grow(T0) is Grow.NONE
    for _ in range(target):
        r.took(T0)
    for _ in range(target):
        assert r.finished(T0) is Next.WAIT
    assert _state(r) == (0, 0, target, 0, 0)
    return r


def test_base_size_spawns_without_waiting() -> None:
    """Below ``target`` workers the pool grows at once, one worker per queued job."""
    r = Regulator(target=2, limit=4)
    r.submitted(T0)
    assert r.grow(T0) is Grow.SPAWN
    r.started(T0)
    assert r.grow(T0) is Grow.NONE  # the running worker will take the job
    assert _state(r) == (1, 0, 0, 0, 1)


def test_waiting_worker_takes_jobs_no_growth() -> None:
    """With a worker waiting, queued work never makes the pool grow."""
    r = _pool()
    r.submitted(T0, 5)
    assert r.grow(T0 + 10) is Grow.NONE
    assert r.wake(T0) is Next.RUN
    assert _state(r) == (1, 0, 1, 0, 5)


def test_blocked_workers_grow_the_pool_after_the_quiet_period() -> None:
    """Every worker blocked in I/O with work queued: a new worker only after 0.1 s."""
    r = _pool(target=2, limit=3)
    r.submitted(T0, 3)
    for _ in range(2):
        assert r.wake(T0) is Next.RUN
        r.took(T0)
        r.block(T0)
    assert _state(r) == (0, 2, 0, 0, 1)
    assert r.grow(T0) is Grow.NONE
    assert r.deadline() == pytest.approx(T0 + QUIET_PERIOD)
    assert r.grow(T0 + 0.099) is Grow.NONE
    assert r.grow(T0 + 0.1) is Grow.SPAWN
    r.started(T0 + 0.1)
    r.took(T0 + 0.1)
    r.block(T0 + 0.1)
    r.submitted(T0 + 0.1)
    assert r.grow(T0 + 0.15) is Grow.NONE  # its own quiet period again
    assert r.grow(T0 + 0.3) is Grow.NONE  # at the limit (3 workers)
    assert r.spawned == 3


def test_a_break_in_the_shortfall_restarts_the_quiet_period() -> None:
    """A worker that unblocks for a moment resets the 0.1 s clock (no flip-flop growth)."""
    r = _pool(target=1, limit=3)
    r.submitted(T0, 2)
    r.wake(T0)
    r.took(T0)
    r.block(T0)
    assert r.grow(T0 + 0.05) is Grow.NONE
    r.unblock(T0 + 0.06)  # running == target: no shortfall
    r.block(T0 + 0.07)
    assert r.grow(T0 + 0.12) is Grow.NONE
    assert r.grow(T0 + 0.18) is Grow.SPAWN


def test_overcommit_parks_at_job_boundaries_and_spares_are_unparked_first() -> None:
    """Blocked workers coming back overcommit: finishing workers park; a spare is reused."""
    r = _pool(target=1, limit=3)
    r.submitted(T0, 3)
    r.wake(T0)
    r.took(T0)
    r.block(T0)
    assert r.grow(T0 + 0.1) is Grow.SPAWN
    r.started(T0 + 0.1)
    r.took(T0 + 0.1)
    r.unblock(T0 + 0.2)  # two running, target 1
    assert r.overcommit == 1
    assert r.finished(T0 + 0.2) is Next.PARK
    assert _state(r) == (1, 0, 0, 1, 1)
    assert r.finished(T0 + 0.2) is Next.RUN  # at the target: keeps going
    r.took(T0 + 0.2)
    r.block(T0 + 0.2)
    r.submitted(T0 + 0.2)
    assert r.grow(T0 + 0.25) is Grow.NONE
    assert r.grow(T0 + 0.31) is Grow.UNPARK
    r.unpark(T0 + 0.31)
    assert _state(r) == (1, 1, 0, 0, 1)
    assert r.spawned == 2 and r.unparked == 1


def test_waiting_worker_woken_while_overcommitted_parks() -> None:
    """The seed's quarantine: a waiting worker that would overcommit parks instead of running."""
    r = _pool(target=2, limit=4)
    r.submitted(T0, 2)
    r.wake(T0)
    r.took(T0)
    r.block(T0)
    assert r.grow(T0 + 0.1) is Grow.NONE  # one worker still waiting: no shortfall
    r.wake(T0)
    r.took(T0)
    r.block(T0)
    assert r.grow(T0 + 0.1) is Grow.NONE  # nothing queued
    r.submitted(T0 + 0.2)
    assert r.grow(T0 + 0.3) is Grow.SPAWN
    r.started(T0 + 0.3)
    r.unblock(T0 + 0.3)
    r.unblock(T0 + 0.3)  # three running, target 2
    assert r.finished(T0 + 0.3) is Next.PARK
    assert r.finished(T0 + 0.3) is Next.RUN
    r.took(T0 + 0.3)
    assert r.finished(T0 + 0.3) is Next.WAIT
    r.submitted(T0 + 0.4)
    assert r.wake(T0 + 0.4) is Next.RUN


def test_bad_transitions_are_bugs() -> None:
    """Moving a worker out of an empty state raises InvariantError naming the state."""
    r = Regulator(target=1, limit=1)
    with pytest.raises(InvariantError, match="blocked"):
        r.unblock(T0)
    with pytest.raises(InvariantError, match="empty queue"):
        r.took(T0)
    with pytest.raises(InvariantError, match="limit"):
        Regulator(target=2, limit=1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["submit", "tick", "block", "unblock", "finish", "wake"]),
            st.floats(min_value=0.0, max_value=0.2),
        ),
        max_size=80,
    )
)
def test_invariants_over_random_workloads(steps: list[tuple[str, float]]) -> None:
    """Counts stay non-negative, workers never exceed the limit, the pool grows only if short."""
    r = Regulator(target=2, limit=5)
    now = T0
    for op, dt in steps:
        now += dt
        if op == "submit":
            r.submitted(now)
        elif op == "block" and r.running:
            r.block(now)
        elif op == "unblock" and r.blocked:
            r.unblock(now)
        elif op == "finish" and r.running:
            if r.queued and r.running + r.waiting <= r.target:
                r.took(now)
            r.finished(now)
        elif op == "wake" and r.waiting and r.wake(now) is Next.RUN:
            r.took(now)
        short = r.queued > 0 and r.waiting == 0 and r.running < r.target
        decision = r.grow(now)
        if decision is not Grow.NONE:
            assert short
        if decision is Grow.SPAWN:
            r.started(now)
        elif decision is Grow.UNPARK:
            r.unpark(now)
        assert min(r.running, r.blocked, r.waiting, r.parked, r.queued) >= 0
        assert r.workers <= r.limit
