"""Scheduler state after each step: blockers, dead destinations, rate delays, reads, timers."""

from __future__ import annotations

from typing import Any

import pytest

from qmgrd.core import (
    DestinationDead,
    DestinationRevived,
    MessageDone,
    RecipientsDeferred,
    SchedulerParams,
    TransportDead,
    TransportParams,
    TransportRevived,
)
from qmgrd.core.dll import DList, Link
from qmgrd.errors import InvariantError
from tests.unit.core.schedsim import Sim, digits


def _one_at_a_time(**kw: Any) -> TransportParams:
    base: dict[str, Any] = {
        "destination_recipient_limit": 1,
        "initial_destination_concurrency": 1,
        "destination_concurrency_limit": 1,
        "delivery_slot_cost": 0,
    }
    base.update(kw)
    return TransportParams(**base)


def test_dlist_rotate_and_safe_iteration() -> None:
    """rotate makes the link the tail; iteration survives unlinking the current link."""
    lst: DList[int] = DList()
    links = [Link(i) for i in range(4)]
    for link in links:
        lst.append(link)
    lst.rotate(links[1])
    assert list(lst) == [2, 3, 0, 1]
    for link in lst.iter_links():
        if link.item % 2 == 0:
            lst.unlink(link)
    assert list(lst) == [3, 1] and len(lst) == 2
    with pytest.raises(InvariantError):
        lst.unlink(links[0])


def test_blocker_job_skipped_until_its_queue_has_room() -> None:
    """A job whose only destination is full is marked a blocker and skipped; room clears it."""
    sim = Sim({"smtp": _one_at_a_time()})
    sim.add("1", [("smtp", "slow")] * 2)
    sim.add("2", [("smtp", "fast")] * 2)
    t = sim.sched.find_transport("smtp")
    assert t is not None
    e1 = sim.sched.select(sim.now)
    e2 = sim.sched.select(sim.now)
    assert e1 is not None and e2 is not None
    assert (e1.queue_name, e2.queue_name) == ("slow", "fast")
    msg1 = sim.sched.find_message("1")
    assert msg1 is not None
    job1 = msg1.jobs["smtp"]
    assert job1.blocker_tag == t.blocker_tag  # slow is full: job 1 is a blocker
    assert t.queues["slow"].blocker_tag == t.blocker_tag
    assert sim.sched.select(sim.now) is None  # both queues full
    assert t.job_current is None
    sim.sched.entry_done(e2, now=sim.now)  # fast (tagged by job 2) has room: tag bumped
    e3 = sim.sched.select(sim.now)
    assert e3 is not None and e3.queue_name == "fast"
    assert job1.is_blocker  # re-examined from the head and re-marked: slow is still full
    tag = t.blocker_tag
    sim.sched.entry_done(e1, now=sim.now)  # slow has room and todo: tag bumped
    assert t.blocker_tag == tag + 2 and not job1.is_blocker
    e4 = sim.sched.select(sim.now)
    assert e4 is not None and e4.message.queue_id == "1"


def test_dead_destination_defers_todo_and_new_recipients() -> None:
    """Negative feedback at window 1 kills the queue: todo and later recipients are deferred."""
    sim = Sim({"smtp": _one_at_a_time()}, SchedulerParams(minimal_backoff_time=300.0))
    sim.add("1", [("smtp", "dead.example")] * 3)
    e = sim.sched.select(sim.now)
    assert e is not None
    sim.sched.entry_done(e, hop_failure=("4.4.1", "connect refused"), now=sim.now)
    events = sim.drain_events()
    dead = [ev for ev in events if isinstance(ev, DestinationDead)]
    deferred = [ev for ev in events if isinstance(ev, RecipientsDeferred)]
    assert len(dead) == 1 and dead[0].reason == "delivery temporarily suspended: connect refused"
    assert sum(len(d.recipients) for d in deferred) == 2
    assert any(isinstance(ev, MessageDone) for ev in events)
    t = sim.sched.find_transport("smtp")
    assert t is not None and t.queues["dead.example"].window.throttled
    mark = len(sim.events)
    sim.add("2", [("smtp", "dead.example")])
    later = sim.events[mark:]
    assert [type(ev) for ev in later] == [RecipientsDeferred, MessageDone]
    assert sim.sched.next_deadline() == pytest.approx(sim.now + 300.0)
    sim.sched.run_timers(sim.now + 300.0)
    assert [type(ev) for ev in sim.drain_events()] == [DestinationRevived]
    assert "dead.example" not in t.queues  # revived and empty: deleted
    assert sim.sched.next_deadline() is None


def test_dead_destination_revived_by_successful_inflight_delivery() -> None:
    """Positive feedback from a delivery still in flight revives a dead queue (notes §13.3)."""
    params = TransportParams(destination_recipient_limit=1, initial_destination_concurrency=3)
    sim = Sim({"smtp": params})
    sim.add("1", [("smtp", "d")] * 3)
    a, b, c = (sim.sched.select(sim.now) for _ in range(3))
    assert a is not None and b is not None and c is not None
    sim.sched.entry_done(a, hop_failure=("4.4.2", "lost connection"), now=sim.now)
    q = c.queue
    assert q.window.window == 1  # 3 -> 1: the f=1 double decrement (notes §13.4)
    sim.sched.entry_done(b, hop_failure=("4.4.2", "lost connection"), now=sim.now)
    assert q.window.throttled  # fail_cohorts 1/3 + 1/1 >= 1
    sim.sched.entry_done(c, now=sim.now)
    kinds = [type(ev) for ev in sim.drain_events()]
    assert DestinationRevived in kinds and kinds[-1] is MessageDone
    assert q.deleted  # revived to window 1 (busy), then empty and READY: deleted


def test_crash_gives_no_feedback() -> None:
    """A crashed delivery neither shrinks nor grows the window."""
    sim = Sim({"smtp": TransportParams(destination_recipient_limit=1)})
    sim.add("1", [("smtp", "d")] * 2)
    e = sim.sched.select(sim.now)
    assert e is not None
    before = e.queue.window.window
    sim.sched.entry_done(e, crashed=True, now=sim.now)
    assert e.queue.window.window == before and e.queue.window.success == 0.0


def test_destination_rate_delay_suspends_and_resumes() -> None:
    """With destination_rate_delay each completion suspends the queue for the delay."""
    sim = Sim({"smtp": TransportParams(destination_recipient_limit=1, destination_rate_delay=10.0)})
    sim.add("1", [("smtp", "d")] * 2)
    e = sim.sched.select(sim.now)
    assert e is not None and sim.sched.select(sim.now) is None  # limit forced to 1
    sim.sched.entry_done(e, now=sim.now)
    assert e.queue.window.suspended
    assert sim.sched.select(sim.now) is None
    assert sim.sched.next_deadline() == sim.now + 10.0
    sim.sched.run_timers(sim.now + 9.0)
    assert sim.sched.select(sim.now + 9.0) is None
    sim.sched.run_timers(sim.now + 10.0)
    e2 = sim.sched.select(sim.now + 10.0)
    assert e2 is not None and e2.queue is e.queue


def test_transport_rate_delay_spaces_selections() -> None:
    """transport_rate_delay allows one selection, then a gap after each completion."""
    sim = Sim({"smtp": TransportParams(destination_recipient_limit=1, transport_rate_delay=5.0)})
    sim.add("1", [("smtp", "a"), ("smtp", "b")])
    e = sim.sched.select(sim.now)
    assert e is not None and sim.sched.select(sim.now) is None
    sim.sched.entry_done(e, now=sim.now)
    assert sim.sched.select(sim.now) is None
    assert sim.sched.next_deadline() == sim.now + 5.0
    sim.sched.run_timers(sim.now + 5.0)
    assert sim.sched.select(sim.now + 5.0) is not None


def test_transport_failed_defers_everything_until_retry_time() -> None:
    """An agent that cannot run kills the transport; its entries and new mail are deferred."""
    sim = Sim(
        {"smtp": TransportParams(destination_recipient_limit=1)},
        SchedulerParams(transport_retry_time=60.0),
    )
    sim.add("1", [("smtp", "a"), ("smtp", "b")])
    e = sim.sched.select(sim.now)
    assert e is not None
    sim.sched.transport_failed("smtp", "4.3.0", "mail transport unavailable", sim.now, entry=e)
    events = sim.drain_events()
    assert isinstance(events[0], TransportDead)
    assert sum(len(ev.recipients) for ev in events if isinstance(ev, RecipientsDeferred)) == 2
    assert isinstance(events[-1], MessageDone)
    assert sim.sched.rcpt_count == 0 and sim.sched.message_count == 0
    mark = len(sim.events)
    sim.add("2", [("smtp", "a")])
    assert isinstance(sim.events[mark], RecipientsDeferred)
    sim.sched.run_timers(sim.now + 60.0)
    assert [type(ev) for ev in sim.drain_events()] == [TransportRevived]


def test_flush_revives_dead_queues() -> None:
    """flush() forgets dead destinations at once."""
    sim = Sim({"smtp": _one_at_a_time()})
    sim.add("1", [("smtp", "d"), ("smtp", "d")])
    e = sim.sched.select(sim.now)
    assert e is not None
    sim.sched.entry_done(e, hop_failure=("4.4.1", "x"), now=sim.now)
    sim.drain_events()
    sim.sched.flush(sim.now)
    assert DestinationRevived in [type(ev) for ev in sim.drain_events()]
    t = sim.sched.find_transport("smtp")
    assert t is not None and not t.queues


def test_process_limit_bounds_busy_entries() -> None:
    """select returns None once a transport has process_limit busy entries."""
    sim = Sim({"smtp": TransportParams(process_limit=3, destination_recipient_limit=1)})
    sim.add("1", [("smtp", f"d{i}") for i in range(10)])
    got = [sim.sched.select(sim.now) for _ in range(4)]
    assert [g is not None for g in got] == [True, True, True, False]


def test_transports_round_robin() -> None:
    """Two transports with work alternate."""
    one = TransportParams(destination_recipient_limit=1)
    sim = Sim({"smtp": one, "relay": one})
    sim.add("1", [("smtp", "a")] * 3 + [("relay", "b")] * 3)
    seq = [e.transport for e in sim.run_serial()]
    assert seq[:4] in (["smtp", "relay", "smtp", "relay"], ["relay", "smtp", "relay", "smtp"])


def test_entries_batch_up_to_destination_recipient_limit() -> None:
    """Recipients for one destination share entries of at most the recipient limit (VERP: 1)."""
    sim = Sim({"smtp": TransportParams(destination_recipient_limit=3)})
    sim.add("1", [("smtp", "a")] * 7)
    sizes = [len(e.recipients) for e in sim.run_serial()]
    assert sorted(sizes) == [1, 3, 3]
    sim.add("2", [("smtp", "a")] * 3, single_rcpt=True)
    assert [len(e.recipients) for e in sim.run_serial()] == [1, 1, 1]


def test_connection_cache_flags_back_to_back() -> None:
    """LOAD|STORE turn on for a back-to-back selection; STORE alone turns off later."""
    sim = Sim({"smtp": TransportParams(destination_recipient_limit=1)})
    sim.add("1", [("smtp", "a")] * 3)
    e1 = sim.sched.select(sim.now)
    assert e1 is not None and not e1.cache_load and not e1.cache_store
    sim.sched.entry_done(e1, now=sim.now)
    e2 = sim.sched.select(sim.now + 0.5)
    assert e2 is not None and e2.cache_load and e2.cache_store
    sim.sched.entry_done(e2, now=sim.now + 0.5)
    e3 = sim.sched.select(sim.now + 10.0)
    assert e3 is not None and e3.cache_load and not e3.cache_store


def test_read_batches_and_refill_after_last_entry() -> None:
    """A big message is read in batches; the next batch is requested when core runs dry."""
    sp = SchedulerParams(
        qmgr_message_active_limit=2,
        qmgr_message_recipient_limit=2,
        qmgr_message_recipient_minimum=3,
    )
    tp = TransportParams(
        destination_recipient_limit=1,
        recipient_limit=4,
        extra_recipient_limit=0,
        recipient_refill_limit=100,
    )
    sim = Sim({"smtp": tp}, sp)
    msg = sim.add("1", [("smtp", f"d{i}") for i in range(20)], serve=False)
    (req,) = sim.sched.pop_reads()
    assert req.limit == 3  # max(2 - 0, minimum 3)
    sim.sched.recipients_add(msg, sim.files["1"][:3], 3, sim.now)
    assert msg.rcpt_limit == 3 + 4  # the job took the whole pool
    done = sim.run_serial()
    assert len(done) == 20 and digits(done) == "1" * 20
    assert isinstance(sim.events[-1], MessageDone)
    t = sim.sched.find_transport("smtp")
    assert t is not None and t.rcpt_unused == 4


def test_no_second_read_while_one_is_in_flight() -> None:
    """A job whose message has a read outstanding is skipped, not retired or marked a blocker."""
    sp = SchedulerParams(
        qmgr_message_recipient_limit=1,
        qmgr_message_active_limit=1,
        qmgr_message_recipient_minimum=2,
    )
    tp = TransportParams(
        destination_recipient_limit=1,
        recipient_limit=2,
        extra_recipient_limit=0,
        recipient_refill_limit=1,
    )
    sim = Sim({"smtp": tp}, sp)
    msg = sim.add("1", [("smtp", "a")] * 6, serve=False)
    (req,) = sim.sched.pop_reads()
    sim.sched.recipients_add(msg, sim.files["1"][: req.limit], req.limit, sim.now)
    e = sim.sched.select(sim.now)  # opportunistic refill requested here (spare 2 >= 1)
    assert e is not None and msg.reading
    reads = sim.sched.pop_reads()
    assert len(reads) == 1
    e2 = sim.sched.select(sim.now)
    assert e2 is not None
    job = msg.jobs["smtp"]
    assert sim.sched.select(sim.now) is None  # no entries, read in flight
    assert job.read_wait and job.stack_level == 0 and not job.is_blocker
    assert sim.sched.pop_reads() == []  # no second read
    r = reads[0]
    sim.sched.recipients_add(
        msg, sim.files["1"][r.offset : r.offset + r.limit], r.offset + r.limit, sim.now
    )
    assert not job.read_wait
    assert sim.sched.select(sim.now) is not None


def test_recipients_add_rejects_unrequested_batch() -> None:
    """A batch without a read in flight, or larger than the budget, is a bug."""
    sim = Sim({})
    msg = sim.add("1", [("smtp", "a")] * 2, serve=False)
    (req,) = sim.sched.pop_reads()
    with pytest.raises(InvariantError):
        sim.sched.recipients_add(msg, sim.files["1"] * (req.limit + 1), 0, sim.now)
    sim.sched.recipients_add(msg, sim.files["1"], 0, sim.now)
    with pytest.raises(InvariantError):
        sim.sched.recipients_add(msg, [], 0, sim.now)


def test_update_params_applies_to_live_queues() -> None:
    """A reload clamps live windows to a new concurrency limit and keeps in-core mail."""
    tp = {"smtp": TransportParams(destination_recipient_limit=1)}
    sim = Sim(tp)
    sim.add("1", [("smtp", "a")] * 4)
    e = sim.sched.select(sim.now)
    assert e is not None and e.queue.window.window == 5
    new = TransportParams(
        destination_recipient_limit=1,
        destination_concurrency_limit=2,
        initial_destination_concurrency=1,
    )
    sim.sched.update_params(SchedulerParams(), lambda name: new)
    assert e.queue.window.window == 2
    sim.sched.entry_done(e, now=sim.now)
    assert len(sim.run_serial()) == 3


def test_back_to_back_survives_a_queue_going_idle_for_under_a_second() -> None:
    """A destination queue deleted when idle and re-created within 1 s keeps b2b caching.

    Postfix would forget ``last_done`` with the queue, so a trickle of single-recipient mail
    never turns caching on (qmgrd difference, measured with bench/throughput.py).
    """
    sim = Sim({"smtp": TransportParams()})
    t0 = sim.now
    sim.add("1", [("smtp", "a")])
    e1 = sim.sched.select(t0)
    assert e1 is not None and not e1.cache_store
    sim.sched.entry_done(e1, now=t0)
    smtp = sim.sched.find_transport("smtp")
    assert smtp is not None
    assert "a" not in smtp.queues
    sim.now = t0 + 0.5
    sim.add("2", [("smtp", "a")])
    e2 = sim.sched.select(t0 + 0.5)
    assert e2 is not None and e2.cache_load and e2.cache_store
    sim.sched.entry_done(e2, now=t0 + 0.5)
    sim.now = t0 + 5.0
    sim.add("3", [("smtp", "a")])
    e3 = sim.sched.select(t0 + 5.0)
    assert e3 is not None and not e3.cache_load and not e3.cache_store
