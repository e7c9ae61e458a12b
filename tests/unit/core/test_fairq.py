"""Fair queuing between flows (qmgrd.core.fairq) and its composition with nqmgr (scheduler)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.core import Entry, SchedulerParams, TransportParams
from qmgrd.core.fairq import FairJob, FairSet, deal_hand
from qmgrd.core.flow import FLOW_NONE, Flow
from qmgrd.errors import InvariantError
from tests.unit.core.schedsim import Sim, digits
from tests.unit.core.test_scheduler_properties import Work, _tight, check_workload, workloads

A, B, H = Flow("sender_domain:a.test"), Flow("sender_domain:b.test"), Flow("tenant:h", 2.0, "h")


def fair_params(c: int, destination_recipient_limit: int = 50) -> TransportParams:
    """A transport with fairness on, process limit ``c``, no destination limit."""
    return TransportParams(
        process_limit=c,
        destination_concurrency_limit=0,
        destination_recipient_limit=destination_recipient_limit,
        fairness=True,
    )


# ----------------------------------------------------------------------------- fairq alone


def test_hand_is_stable_distinct_and_in_range() -> None:
    """The same key always gets the same hand of distinct indices (no per-run hash seed)."""
    hand = deal_hand("sender_domain:example.org", 64, 8)
    assert hand == deal_hand("sender_domain:example.org", 64, 8)
    assert len(set(hand)) == 8 and all(0 <= i < 64 for i in hand)
    hands = {deal_hand(f"k{i}", 64, 8) for i in range(200)}
    assert len(hands) == 200  # different keys, different hands
    assert sorted(deal_hand("x", 4, 4)) == [0, 1, 2, 3]
    with pytest.raises(InvariantError):
        deal_hand("x", 4, 5)


def test_many_flows_fill_at_most_the_queue_count() -> None:
    """A hostile sender's thousand flows use the 64 queues, no more (bounded state per queue)."""
    sim = Sim({"smtp": fair_params(4)})
    for i in range(1000):
        sim.add(f"m{i}", [("smtp", f"d{i}")], flow=Flow(f"sender_domain:spam{i}.test"))
    fair = sim.sched.find_transport("smtp").fair  # type: ignore[union-attr]
    assert fair is not None
    assert len(fair.flows) == 1000
    assert sum(1 for q in fair.queues if q.jobs) == 64
    # a newcomer's hand has 8 queues: it shares one with the spam flows, but one queue only
    sim.add("ok", [("smtp", "good")], flow=Flow("sender_domain:good.test"))
    assert fair.flows["sender_domain:good.test"].queue.flows >= 2


def test_virtual_time_advances_at_min_c_executing_over_weights() -> None:
    """R(t) grows by dt * min(C, executing) / (sum of non-empty weights)."""
    fair = FairSet(4, 1, concurrency=2)
    jobs = [FairJob(None, flow) for flow in (A, H)]  # type: ignore[arg-type]
    fair.advance(0.0)
    for fj in jobs:
        fair.job_linked(fj, 0.0)
    assert fair.weight_sum == 3.0
    for fj in jobs * 2:  # 4 executing, C = 2
        fair.dispatch(fj, 0.0)
    fair.advance(3.0)
    assert fair.virtual_time == pytest.approx(3.0 * 2 / 3.0)


def test_service_time_correction_charges_what_the_delivery_took() -> None:
    """Dispatch charges G / w; completion with S gives back (G - S) / w."""
    fair = FairSet(2, 1, concurrency=10, guess=1.0)
    fj = FairJob(None, H)  # type: ignore[arg-type]
    fair.job_linked(fj, 0.0)
    queue = fj.queue
    assert queue is not None
    start = queue.virtual_start
    fair.dispatch(fj, 0.0)
    assert queue.virtual_start == pytest.approx(start + 0.5)
    fair.complete(queue, 0.2, 0.0)
    assert queue.virtual_start == pytest.approx(start + 0.1)  # charged S / w = 0.2 / 2


# ----------------------------------------------------------------------------- in the scheduler


def run_concurrent(
    sim: Sim,
    c: int,
    service: dict[str, float] | None = None,
    max_steps: int = 20000,
    on_step: object = None,
) -> list[Entry]:
    """Keep ``c`` deliveries running; each takes ``service[flow key]`` (default 1 s) and is
    completed with its real time as S; returns the entries in selection order."""
    busy: list[tuple[float, int, Entry]] = []
    order: list[Entry] = []
    for _ in range(max_steps):
        sim.serve_reads()
        while len(busy) < c:
            entry = sim.sched.select(sim.now)
            if entry is None:
                break
            took = (service or {}).get(entry.message.flow.key, 1.0)
            busy.append((sim.now + took, len(order), entry))
            order.append(entry)
        if not busy:
            if sim.serve_reads():
                continue
            break
        busy.sort(key=lambda b: (b[0], b[1]))
        end, _, entry = busy.pop(0)
        took = (service or {}).get(entry.message.flow.key, 1.0)
        sim.now = end
        sim.sched.entry_done(entry, now=sim.now, service_time=took)
        sim.drain_events()
    return order


def backlog(sim: Sim, flows: Sequence[Flow], n: int) -> None:
    """``n`` single-recipient messages per flow, flow by flow (FIFO would serve them in turn)."""
    for flow in flows:
        for i in range(n):
            sim.add(f"{flow.label}.{i}", [("smtp", f"{flow.label}{i}")], flow=flow)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=st.integers(1, 6), n=st.integers(60, 150), order=st.permutations([A, B, H]))
def test_backlogged_flows_get_weighted_shares_within_c(c: int, n: int, order: list[Flow]) -> None:
    """Flows weighted 1/1/2, all backlogged: over every window of deliveries each flow's count
    stays within C of its weighted fair share (the seed's bound), whatever the arrival order."""
    sim = Sim({"smtp": fair_params(c)})
    backlog(sim, order, n)
    flows = [e.message.flow.key for e in run_concurrent(sim, c)]
    assert len(flows) == 3 * n
    # while all three are backlogged: until the heavy flow (half the share) runs out
    end = _last_all_backlogged(flows, n)
    share = {A.key: 0.25, B.key: 0.25, H.key: 0.5}
    for size in (4, 16, 64):
        for start in range(0, max(0, end - size)):
            counts = Counter(flows[start : start + size])
            for key, part in share.items():
                assert abs(counts[key] - part * size) <= c, (size, start, key, counts)


def _last_all_backlogged(flows: list[str], n: int) -> int:
    """The number of deliveries before some flow had handed out its last message."""
    seen: Counter[str] = Counter()
    for i, key in enumerate(flows):
        seen[key] += 1
        if seen[key] == n:
            return i
    return len(flows)


@pytest.mark.parametrize("c", [1, 3])
def test_idle_flow_that_wakes_up_is_served_within_one_round(c: int) -> None:
    """A flow with nothing queued gets a message while A and H are backlogged: its delivery is
    among the next NEQ + C selections (one round), not behind the backlog."""
    sim = Sim({"smtp": fair_params(c)})
    backlog(sim, [A, H], 200)
    busy: list[Entry] = []
    order: list[str] = []
    woke_at = None
    for step in range(2000):
        if step == 150:
            sim.add("late", [("smtp", "late-dest")], flow=B)
            woke_at = len(order)
        while len(busy) < c:
            entry = sim.sched.select(sim.now)
            if entry is None:
                break
            busy.append(entry)
            order.append(entry.message.queue_id)
        if not busy:
            break
        sim.now += 1.0
        sim.sched.entry_done(busy.pop(0), now=sim.now, service_time=1.0)
        sim.drain_events()
    assert woke_at is not None
    position = order.index("late") - woke_at
    assert position <= 2 + c, (position, order[woke_at : woke_at + 10])


def test_faster_flow_gets_more_deliveries_by_service_time() -> None:
    """G - S correction: with equal weights, a flow whose deliveries take a quarter of the time
    gets about four times the deliveries (equal shares of delivery time)."""
    sim = Sim({"smtp": fair_params(2)})
    backlog(sim, [A, B], 400)
    order = run_concurrent(sim, 2, service={A.key: 0.25, B.key: 1.0})
    first = Counter(e.message.flow.key for e in order[:200])
    assert 3.0 <= first[A.key] / first[B.key] <= 5.0, first


def test_small_message_behind_a_backlog_is_not_fifo() -> None:
    """With fairness, B's one message queued behind 300 of A's goes out within a few
    deliveries; without fairness (same flows), nqmgr's FIFO serves it last."""
    for fairness, bound in ((True, 3), (False, 300)):
        p = fair_params(2) if fairness else TransportParams(process_limit=2)
        sim = Sim({"smtp": p})
        backlog(sim, [A], 300)
        sim.add("b", [("smtp", "bdest")], flow=B)
        ids = [e.message.queue_id for e in run_concurrent(sim, 2)]
        assert ids.index("b") <= bound if fairness else ids.index("b") == bound


def test_preemption_still_applies_within_a_flow() -> None:
    """nqmgr's preemption is unchanged with fairness on: a 1-recipient message of the same flow
    preempts a 40-entry message (the seed sequence's behaviour)."""
    p = fair_params(1, destination_recipient_limit=1)
    sim = Sim({"smtp": p})
    sim.add("b", [("smtp", "d")] * 40, queued_time=sim.now - 10, flow=A)
    first = sim.run_serial(max_steps=6)
    sim.add("s", [("smtp", "d")], flow=A)
    rest = sim.run_serial()
    seq = digits(first + rest)
    assert "s" in seq[:15] and seq.count("b") == 40


# ----------------------------------------------------------------------------- fairness none


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(work=workloads(), keys=st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_fairness_off_gives_todays_traces_whatever_the_flows(work: Work, keys: list[int]) -> None:
    """Fairness off: a scheduler given flows (any of them, or FLOW_NONE) selects exactly the
    entries, in exactly the order, that today's scheduler without flows selects."""
    sp, tps, messages, script = work
    flows = [FLOW_NONE, A, B, H]

    def trace(with_flows: bool) -> list[tuple[str, str, int]]:
        sim = Sim(dict(tps), sp)
        out: list[tuple[str, str, int]] = []
        busy: list[Entry] = []
        pending = list(enumerate(messages))
        for action in [*script, *[50] * 200, *[70] * 200]:
            if action < 20 and pending and sim.sched.message_count < sp.qmgr_message_active_limit:
                i, rcpts = pending.pop(0)
                flow = flows[keys[i]] if with_flows else FLOW_NONE
                sim.add(str(i), rcpts, serve=False, flow=flow)
            elif action < 35:
                sim.serve_reads()
            elif action < 65:
                entry = sim.sched.select(sim.now)
                if entry is not None:
                    busy.append(entry)
                    out.append((entry.message.queue_id, entry.queue_name, len(entry.recipients)))
            elif busy:
                entry = busy.pop(action % len(busy))
                sim.sched.entry_done(entry, now=sim.now, service_time=0.5)
            sim.now += 0.25
            sim.sched.run_timers(sim.now)
            sim.drain_events()
        return out

    assert trace(True) == trace(False)


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(work=workloads(), keys=st.lists(st.integers(0, 3), min_size=8, max_size=8))
def test_random_workloads_keep_invariants_with_fairness(work: Work, keys: list[int]) -> None:
    """The scheduler's invariants (exactly-once hand-out, windows, process limits, in-core
    bounds, clean end) hold with fairness on and messages in several flows."""
    sp, tps, messages, script = work
    fair = {
        name: dataclasses.replace(p, fairness=True, fairness_queue_count=3, fairness_hand_size=2)
        for name, p in tps.items()
    }
    flows = [FLOW_NONE, A, B, H]
    check_workload((sp, fair, messages, script), lambda i: flows[keys[i % len(keys)]])


def test_new_job_after_a_stale_exhausted_mark_does_not_strand_earlier_jobs() -> None:
    """Found by hypothesis: a fair queue exhausted at an older blocker tag gets a new job; the
    cursor must not jump past a job not walked at this tag (its destination was rate-delayed
    and resumes without a blocker mark), or that message never leaves the active queue."""
    one = dataclasses.replace(_tight(), fairness=True, fairness_queue_count=3, fairness_hand_size=2)
    sp = SchedulerParams(
        qmgr_message_active_limit=2,
        qmgr_message_recipient_limit=1,
        qmgr_message_recipient_minimum=4,
        minimal_backoff_time=10.0,
        transport_retry_time=5.0,
    )
    tps = {"smtp": one, "local": dataclasses.replace(one, destination_rate_delay=3.0)}
    messages = [
        [("local", "a"), ("local", "a")],
        [("local", "a")],
        [("smtp", "a"), ("smtp", "a"), ("smtp", "a"), ("local", "b"), ("smtp", "a")],
    ]
    check_workload((sp, tps, messages, [0] * 10))  # ends with every message done


def test_reload_turns_fairness_on_and_off_with_jobs_in_core() -> None:
    """update_params moves linked jobs into a new fair set and back out; deliveries go on."""
    sim = Sim({"smtp": TransportParams(process_limit=2)})
    backlog(sim, [A, B], 5)
    first = sim.sched.select(sim.now)
    assert first is not None
    sim.tparams["smtp"] = fair_params(2)
    sim.sched.update_params(SchedulerParams(), sim._params)
    fair = sim.sched.find_transport("smtp").fair  # type: ignore[union-attr]
    assert fair is not None and set(fair.flows) == {A.key, B.key}
    sim.sched.entry_done(first, now=sim.now, service_time=1.0)  # dispatched before: no charge
    assert fair.executing == 0
    sim.tparams["smtp"] = TransportParams(process_limit=2)
    sim.sched.update_params(SchedulerParams(), sim._params)
    assert sim.sched.find_transport("smtp").fair is None  # type: ignore[union-attr]
    assert len(sim.run_serial()) == 9
