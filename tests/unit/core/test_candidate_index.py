"""The indexed preemption candidate search chooses exactly what Postfix's linear walk chooses."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.core import Entry, SchedulerParams, TransportParams, jobindex
from qmgrd.core import job as job_module
from qmgrd.core.job import Job
from qmgrd.core.jobindex import candidate_linear, candidate_search, index_check
from tests.unit.core.schedsim import Sim

TRANSPORTS = ("smtp", "relay")
DESTS = ("a", "b", "c", "d", "e", "f")

Rcpts = list[tuple[str, str]]


@dataclass(frozen=True)
class Workload:
    """Parameters, messages (recipients and queued-time offsets) and an action script."""

    sp: SchedulerParams
    tps: dict[str, TransportParams]
    messages: list[tuple[Rcpts, int]]
    script: list[int]


@st.composite
def transport_params(draw: st.DrawFn) -> TransportParams:
    """Preemption on (cost >= 2) with small windows, so blockers and stacks are common."""
    limit = draw(st.integers(1, 3))
    return TransportParams(
        process_limit=draw(st.integers(0, 6)),
        destination_concurrency_limit=limit,
        initial_destination_concurrency=draw(st.integers(1, limit)),
        destination_recipient_limit=draw(st.integers(1, 3)),
        recipient_limit=draw(st.integers(5, 200)),
        extra_recipient_limit=draw(st.integers(0, 20)),
        recipient_refill_limit=draw(st.integers(1, 5)),
        delivery_slot_cost=draw(st.integers(2, 5)),
        delivery_slot_loan=draw(st.integers(0, 3)),
        delivery_slot_discount=draw(st.sampled_from([0, 50, 100])),
        minimum_delivery_slots=draw(st.integers(0, 3)),
        failed_cohort_limit=draw(st.integers(0, 2)),
        destination_rate_delay=draw(st.sampled_from([0.0, 0.0, 0.0, 2.0])),
    )


@st.composite
def workloads(draw: st.DrawFn) -> Workload:
    """Many jobs of random sizes, arriving in random order (queued times may lie ahead)."""
    sp = SchedulerParams(
        qmgr_message_active_limit=draw(st.integers(2, 40)),
        qmgr_message_recipient_limit=draw(st.integers(5, 300)),
        qmgr_message_recipient_minimum=draw(st.integers(1, 5)),
        minimal_backoff_time=10.0,
        transport_retry_time=5.0,
    )
    tps = {name: draw(transport_params()) for name in TRANSPORTS}
    rcpt = st.tuples(st.sampled_from(TRANSPORTS), st.sampled_from(DESTS))
    message = st.tuples(st.lists(rcpt, min_size=1, max_size=40), st.integers(-30, 3))
    messages = draw(st.lists(message, min_size=1, max_size=40))
    script = draw(st.lists(st.integers(0, 99), min_size=20, max_size=400))
    return Workload(sp, tps, messages, script)


@st.composite
def stacking_workloads(draw: st.DrawFn) -> Workload:
    """One transport, cheap preemption, jobs arriving newest-smallest: deep preemption stacks."""
    tp = TransportParams(
        process_limit=draw(st.integers(1, 3)),
        destination_concurrency_limit=draw(st.integers(1, 3)),
        destination_recipient_limit=1,
        delivery_slot_cost=2,
        delivery_slot_loan=draw(st.integers(0, 3)),
        delivery_slot_discount=draw(st.sampled_from([0, 50, 100])),
        minimum_delivery_slots=draw(st.integers(0, 1)),
    )
    sp = SchedulerParams(qmgr_message_active_limit=40, qmgr_message_recipient_limit=2000)
    sizes = draw(st.lists(st.integers(1, 60), min_size=2, max_size=30))
    sizes.sort(reverse=draw(st.booleans()))
    rcpt = st.tuples(st.just("smtp"), st.sampled_from(DESTS))
    messages = [
        (draw(st.lists(rcpt, min_size=n, max_size=n)), draw(st.integers(-2, 2))) for n in sizes
    ]
    script = draw(st.lists(st.sampled_from([0, 40, 40, 50, 70, 70, 95]), min_size=20, max_size=250))
    return Workload(sp, {"smtp": tp, "relay": tp}, messages, script)


@contextmanager
def small_nodes() -> Iterator[None]:
    """Chunks of at most 4 jobs and groups of at most 4 chunks: every split and merge runs."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(jobindex, "CHUNK_MAX", 4)
        mp.setattr(jobindex, "GROUP_MAX", 4)
        yield


@contextmanager
def search_with(search: Callable[[Job, int], Job | None]) -> Iterator[None]:
    """Make the scheduler's cached candidate lookup use ``search``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(job_module, "candidate_search", search)
        yield


def run(work: Workload, probe: Callable[[Sim], None] | None = None) -> list[tuple[str, ...]]:
    """Drive a scheduler through the script; return every selection (message, queue, rcpts)."""
    sim = Sim(work.tps, work.sp)
    busy: list[Entry] = []
    trace: list[tuple[str, ...]] = []
    pending = list(enumerate(work.messages))

    def add() -> None:
        if pending and sim.sched.message_count < work.sp.qmgr_message_active_limit:
            i, (rcpts, offset) = pending.pop(0)
            sim.add(str(i), rcpts, queued_time=sim.now + offset, serve=False)

    def select() -> bool:
        entry = sim.sched.select(sim.now)
        if entry is None:
            return False
        trace.append(
            (entry.message.queue_id, entry.queue.name, *(r.address for r in entry.recipients))
        )
        busy.append(entry)
        return True

    def complete(choice: int) -> None:
        if busy:
            entry = busy.pop(choice % len(busy))
            hop = ("4.4.1", "refused") if choice % 7 == 0 else None
            sim.sched.entry_done(entry, hop_failure=hop, crashed=choice % 11 == 0, now=sim.now)
            sim.drain_events()

    def step(action: int) -> None:
        if action < 20:
            add()
        elif action < 35:
            sim.serve_reads()
        elif action < 65:
            select()
        elif action < 90:
            complete(action)
        elif action < 98:
            sim.now += action % 3  # several selections may share one second
            sim.sched.run_timers(sim.now)
            sim.drain_events()
        elif action == 98:
            sim.sched.flush(sim.now)
            sim.drain_events()
        else:  # the relay agent cannot run: its selected entry and every TODO entry deferred
            relay = [e for e in busy if e.transport == "relay"]
            if relay:
                busy.remove(relay[0])
                sim.sched.transport_failed("relay", "4.3.0", "down", sim.now, entry=relay[0])
                sim.drain_events()
        if probe is not None:
            probe(sim)

    for action in work.script:
        step(action)
    for i in range(3000):  # drain: bounded
        if not busy and not pending and sim.sched.message_count == 0:
            break
        add()
        sim.serve_reads()
        if not select():
            if busy:
                complete(1)
            else:
                deadline = sim.sched.next_deadline()
                sim.now = max(sim.now + 1.0, deadline or 0.0)
                sim.sched.run_timers(sim.now)
                sim.drain_events()
        if probe is not None and i % 4 == 0:  # the drain is long: probe a sample of its steps
            probe(sim)
    assert sim.sched.message_count == 0
    return trace


def probe_every_job(sim: Sim) -> None:
    """Check the index against job_list; compare both searches from every job, at several limits."""
    for t in sim.sched.transports():
        jobs = list(t.job_list)
        index_check(t.job_index, jobs)
        now = int(sim.now)
        for i, current in enumerate(jobs):
            probes = ((None, now), (None, now + 7), (1 + i % 4, now - 40), (1000, now))
            for max_slots, when in probes:
                want = candidate_linear(current, when, max_slots)
                got = candidate_search(current, when, max_slots)
                assert got is want, (
                    f"from {current.describe()} at {when}, max_slots {max_slots}: "
                    f"index chose {got and got.describe()}, Postfix {want and want.describe()}"
                )


SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.slow
@SETTINGS
@given(workloads())
def test_index_equals_linear_search_from_every_job(work: Workload) -> None:
    """At every step, from every linked job, at several times and limits, both searches agree."""
    with small_nodes():
        run(work, probe_every_job)


@pytest.mark.slow
@settings(SETTINGS, max_examples=100)
@given(stacking_workloads())
def test_index_equals_linear_search_in_deep_stacks(work: Workload) -> None:
    """With preemption stacks several levels deep (and orphans), both searches still agree."""
    with small_nodes():
        run(work, probe_every_job)


@pytest.mark.slow
@SETTINGS
@given(workloads())
def test_scheduler_choices_equal_with_linear_search(work: Workload) -> None:
    """Every selection of a whole run is the same with the indexed search and with Postfix's."""
    with small_nodes():
        calls = 0

        def checked(current: Job, now: int) -> Job | None:
            nonlocal calls
            calls += 1
            got = candidate_search(current, now)
            assert got is candidate_linear(current, now)
            return got

        with search_with(checked):
            indexed = run(work)
        with search_with(candidate_linear):
            linear = run(work)
    assert indexed == linear


def test_workloads_exercise_preemption() -> None:
    """The generated workloads reach the search, preempt and build stacks (not a vacuous proof)."""
    params = TransportParams(
        process_limit=1,
        destination_recipient_limit=1,
        delivery_slot_cost=2,
        delivery_slot_loan=3,
        minimum_delivery_slots=1,
    )
    work = Workload(
        SchedulerParams(qmgr_message_active_limit=10),
        {"smtp": params, "relay": params},
        [([("smtp", "a")] * 30, -10), ([("smtp", "b")] * 2, 0), ([("smtp", "c")] * 3, 1)]
        + [([("smtp", DESTS[i % 6])] * (1 + i % 4), i % 3) for i in range(8)],
        [0, 0, 0, 30, 50] + [50, 70, 95] * 40,
    )
    levels: list[int] = []
    searches = 0

    def counting(current: Job, now: int) -> Job | None:
        nonlocal searches
        searches += 1
        got = candidate_search(current, now)
        assert got is candidate_linear(current, now)
        return got

    def watch(sim: Sim) -> None:
        for t in sim.sched.transports():
            levels.extend(j.stack_level for j in t.job_list)

    with small_nodes(), search_with(counting):
        trace = run(work, watch)
    assert searches >= 5
    assert max(levels) >= 1, "no job was ever preempted"
    assert [t[0] for t in trace[:3]] == ["0", "1", "1"], "the 2-entry job preempts at once (loan)"
