"""Property tests: ``Scheduler.entry_throttled`` keeps the scheduler's invariants (hypothesis).

Random workloads as in test_scheduler_properties.py, where a completing entry may instead be
refused ("full" or "rate", learning on or off). Whatever happens: no recipient is handed out
while it is already busy, each recipient ends exactly once (delivered or deferred), windows stay
within their bounds, and the core ends empty.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qmgrd.core import Entry, MessageDone, RecipientsDeferred, SchedulerParams, TransportParams
from qmgrd.core.scheduler import ThrottleKind
from tests.unit.core.schedsim import Sim

DESTS = ("a", "b", "c")
HOP = ("4.7.0", "421 4.7.0 too many connections")


@st.composite
def workloads(
    draw: st.DrawFn,
) -> tuple[SchedulerParams, TransportParams, list[list[str]], list[int]]:
    """Parameters, messages (destination lists, one transport) and an action script."""
    sp = SchedulerParams(
        qmgr_message_active_limit=draw(st.integers(1, 4)),
        qmgr_message_recipient_limit=draw(st.integers(1, 20)),
        qmgr_message_recipient_minimum=draw(st.integers(1, 5)),
        minimal_backoff_time=draw(st.sampled_from([5.0, 40.0])),
    )
    limit = draw(st.integers(1, 6))
    tp = TransportParams(
        process_limit=draw(st.integers(1, 8)),
        destination_concurrency_limit=limit,
        initial_destination_concurrency=draw(st.integers(1, limit)),
        destination_recipient_limit=draw(st.integers(1, 3)),
        recipient_limit=draw(st.integers(1, 30)),
        failed_cohort_limit=draw(st.integers(0, 2)),
        destination_rate_delay=draw(st.sampled_from([0.0, 0.0, 3.0])),
        transport_rate_delay=draw(st.sampled_from([0.0, 0.0, 2.0])),
        destination_concurrency_learning=draw(st.booleans()),
        destination_throttle_delay=draw(st.sampled_from([0.0, 1.0, 4.0])),
    )
    messages = draw(
        st.lists(st.lists(st.sampled_from(DESTS), min_size=1, max_size=20), min_size=1, max_size=6)
    )
    script = draw(st.lists(st.integers(0, 99), min_size=10, max_size=300))
    return sp, tp, messages, script


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(workloads())
def test_throttled_entries_keep_invariants(
    work: tuple[SchedulerParams, TransportParams, list[list[str]], list[int]],
) -> None:
    """Exactly-once outcome per recipient, never two hand-outs at once, bounded windows, no
    selection while busy >= window, and a clean end, with refusals mixed into random workloads."""
    sp, tp, messages, script = work
    sim = Sim({"smtp": tp}, sp)
    busy: list[Entry] = []
    in_flight: set[tuple[str, int]] = set()
    ended: Counter[tuple[str, int]] = Counter()
    done_msgs: set[str] = set()
    pending = list(enumerate(messages))

    def account() -> None:
        for ev in sim.drain_events():
            if isinstance(ev, RecipientsDeferred):
                for r in ev.recipients:
                    assert isinstance(r.payload, tuple)
                    assert r.payload not in in_flight
                    ended[r.payload] += 1
            elif isinstance(ev, MessageDone):
                done_msgs.add(ev.message.queue_id)

    def keys(entry: Entry) -> list[tuple[str, int]]:
        out = []
        for r in entry.recipients:
            assert isinstance(r.payload, tuple)
            out.append(r.payload)
        return out

    def check() -> None:
        t = sim.sched.find_transport("smtp")
        if t is None:
            return
        if tp.process_limit:
            assert t.busy <= tp.process_limit
        for q in t.queues.values():
            w = q.window
            assert w.window >= -1
            if w.ready and tp.effective_concurrency_limit:
                assert w.window <= tp.effective_concurrency_limit
            if w.suspended:
                assert w.resume_to >= 1
                assert q.resume_at is not None

    def select_one() -> bool:
        entry = sim.sched.select(sim.now)
        if entry is None:
            return False
        q = entry.queue
        assert len(q.busy) <= q.window.window, "selected while busy >= window"
        for k in keys(entry):
            assert k not in in_flight, f"{k} handed out twice"
            in_flight.add(k)
        busy.append(entry)
        return True

    def serve() -> None:
        for req in sim.sched.pop_reads():
            rcpts = sim.files[req.message.queue_id]
            batch = rcpts[req.offset : req.offset + req.limit]
            end = req.offset + len(batch)
            sim.sched.recipients_add(req.message, batch, end if end < len(rcpts) else 0, sim.now)
        account()

    def add_message() -> None:
        if pending and sim.sched.message_count < sp.qmgr_message_active_limit:
            i, dests = pending.pop(0)
            sim.add(str(i), [("smtp", d) for d in dests], serve=False)

    def complete(choice: int, *, refusals: bool) -> None:
        if not busy:
            return
        entry = busy.pop(choice % len(busy))
        if refusals and choice % 3 != 0:
            kind: ThrottleKind = "full" if choice % 2 else "rate"
            observed = None if choice % 5 else choice % 4
            if sim.sched.entry_throttled(
                entry, kind=kind, hop=HOP, now=sim.now, observed_busy=observed
            ):
                for k in keys(entry):
                    in_flight.discard(k)
                account()
                return
        hop = HOP if refusals and choice % 3 else None
        for k in keys(entry):
            in_flight.discard(k)
            ended[k] += 1
        sim.sched.entry_done(entry, hop_failure=hop, now=sim.now)
        account()

    for action in script:
        if action < 20:
            add_message()
        elif action < 35:
            serve()
        elif action < 65:
            select_one()
        elif action < 92:
            complete(action, refusals=True)
        else:
            sim.now += 1.0 + action % 4
            sim.sched.run_timers(sim.now)
            account()
        check()

    for _ in range(5000):  # drain: everything succeeds from now on; bounded rounds
        add_message()
        serve()
        while select_one():
            check()
        if busy:
            complete(1, refusals=False)
        elif not pending and sim.sched.message_count == 0:
            break
        else:
            deadline = sim.sched.next_deadline()
            sim.now = max(sim.now + 1.0, deadline or 0.0)
            sim.sched.run_timers(sim.now)
            account()
        check()
    assert sim.sched.message_count == 0 and not pending and not in_flight

    for i, dests in enumerate(messages):
        assert str(i) in done_msgs
        for j in range(len(dests)):
            assert ended[(str(i), j)] == 1, f"recipient {(str(i), j)} ended {ended[(str(i), j)]}x"
    sim.sched.run_timers(sim.now + 1000.0)
    assert sim.sched.rcpt_count == 0
    t = sim.sched.find_transport("smtp")
    assert t is not None
    assert t.rcpt_unused == tp.recipient_limit
    assert not t.job_list and not t.queues and t.busy == 0
