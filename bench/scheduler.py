"""Scheduler throughput: select + entry_done cycles per second with 10, 1,000 and 10,000 jobs.

One transport, 1,000 destinations, messages of 10 recipients to 10 distinct destinations (so a
job has 10 entries, below the default preemption threshold of 15 entries). Each finished message
is replaced by a new one, so the number of jobs in core stays constant; the replacement
(message_create + recipients_add) is part of the measured cost. A second set of runs uses
preemptable jobs (20 entries), so the preemption candidate search runs.

Cycles per second are per second of this process's CPU time (``time.process_time``), not wall
time: the machine is shared, and CPU time does not count the time the process waits for a core.
Each figure is the median of ``--runs`` runs (default 3). With many jobs in core nearly every
object is long lived, and CPython's full collections (one each time the long-lived objects grow by
a quarter) walk all of them: a run lasts at least 20 cycles per job so that its figure includes
that cost, and the share of CPU time spent in the cyclic garbage collector is printed. ``--gc-off``
pauses the collector during the timed loop (a diagnostic, not how the daemon runs). Prints
numbers, asserts nothing.

``--fair`` instead measures fair queuing between flows (qmgrd.core.fairq): cycles/s with fairness
on at 10 and 10,000 jobs (messages spread over 3 and over 100 flows, weights 1 and 2; entry_done
gets the service time), next to the same runs with fairness off, then the shares of deliveries of 3
backlogged flows weighted 1/1/2 in each 1,000-delivery window (10 deliveries in flight, service
times drawn from 0.05-0.5 s with a fixed seed, passed to entry_done as S).

Run: .venv/bin/python bench/scheduler.py [--runs N] [--gc-off] [--fair]
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

import qmgrd
from qmgrd.core import (
    Entry,
    MessageDone,
    ResolvedRecipient,
    Scheduler,
    SchedulerParams,
    TransportParams,
)
from qmgrd.core.flow import FLOW_NONE, Flow

DESTINATIONS = 1000
RCPTS = 10


def _run(
    jobs: int,
    cycles: int,
    rcpts: int = RCPTS,
    gc_off: bool = False,
    flows: tuple[Flow, ...] = (),
) -> tuple[float, float]:
    """Cycles per CPU second with ``jobs`` messages of ``rcpts`` entries in core, and GC share;
    with ``flows``, fairness is on and message ``n`` is in flow ``flows[n % len(flows)]``."""
    sp = SchedulerParams(qmgr_message_active_limit=jobs, qmgr_message_recipient_limit=jobs * rcpts)
    tp = TransportParams(process_limit=0, recipient_limit=jobs * rcpts * 2, fairness=bool(flows))
    sched = Scheduler(sp, lambda name: tp)
    now = 1000.0
    serial = 0

    def add() -> None:
        nonlocal serial
        qid = f"m{serial}"
        base = serial * 7
        serial += 1
        flow = flows[serial % len(flows)] if flows else FLOW_NONE
        msg = sched.message_create(qid, queued_time=now, rcpt_unread=rcpts, flow=flow)
        batch = [
            ResolvedRecipient(
                f"u@d{(base + i) % DESTINATIONS}",
                i + 1,
                "smtp",
                f"d{(base + i) % DESTINATIONS}",
                f"d{(base + i) % DESTINATIONS}",
            )
            for i in range(rcpts)
        ]
        for req in sched.pop_reads():
            sched.recipients_add(req.message, batch, 0, now)
        assert msg.refcount > 0

    for _ in range(jobs):
        add()
    sched.pop_events()
    gc_time = 0.0
    gc_start = 0.0

    def gc_clock(phase: str, info: dict[str, int]) -> None:
        nonlocal gc_time, gc_start
        if phase == "start":
            gc_start = time.process_time()
        else:
            gc_time += time.process_time() - gc_start

    if gc_off:
        gc.collect()
        gc.disable()
    gc.callbacks.append(gc_clock)
    start = time.process_time()
    done = 0
    while done < cycles:
        entry = sched.select(now)
        if entry is None:
            raise RuntimeError("nothing to select")
        sched.entry_done(entry, now=now, service_time=0.001)
        done += 1
        for ev in sched.pop_events():
            if isinstance(ev, MessageDone):
                add()
        now += 0.001
    elapsed = time.process_time() - start
    gc.callbacks.remove(gc_clock)
    gc.enable()
    return cycles / elapsed, gc_time / elapsed


def _fair_shares(windows: int = 5, window: int = 1000, in_flight: int = 10) -> None:
    """Deliveries per flow (weights 1/1/2) in each window of ``window`` deliveries."""
    flows = (Flow("sender_domain:a.test"), Flow("sender_domain:b.test"), Flow("tenant:h", 2.0, "h"))
    total = windows * window
    sp = SchedulerParams(
        qmgr_message_active_limit=3 * total, qmgr_message_recipient_limit=3 * total
    )
    tp = TransportParams(process_limit=in_flight, destination_concurrency_limit=0, fairness=True)
    sched = Scheduler(sp, lambda name: tp)
    rng = random.Random(15)
    now = 1000.0
    for flow in flows:  # each flow's backlog queued as one block: FIFO would serve them in turn
        for i in range(total):
            qid = f"{flow.label}{i}"
            msg = sched.message_create(qid, queued_time=now, rcpt_unread=1, flow=flow)
            rcpt = ResolvedRecipient(f"u@{msg.queue_id}", 1, "smtp", msg.queue_id, msg.queue_id)
            for req in sched.pop_reads():
                sched.recipients_add(req.message, [rcpt], 0, now)
    busy: list[tuple[float, int, float, Entry]] = []  # (end, order, start, entry)
    order: list[str] = []
    while len(order) < total:
        while len(busy) < in_flight:
            entry = sched.select(now)
            if entry is None:
                break
            busy.append((now + rng.uniform(0.05, 0.5), len(order), now, entry))
            order.append(entry.message.flow.key)
        busy.sort(key=lambda b: (b[0], b[1]))
        end, _, began, done = busy.pop(0)
        now = end
        sched.entry_done(done, now=now, service_time=end - began)
        sched.pop_events()
    print(f"shares of deliveries, 3 backlogged flows weighted 1/1/2, {in_flight} in flight:")
    for w in range(windows):
        part = order[w * window : (w + 1) * window]
        shares = " ".join(f"{f.label}={part.count(f.key) / window:.3f}" for f in flows)
        print(f"  window {w + 1} (deliveries {w * window + 1}-{(w + 1) * window}): {shares}")


def _fair_main(runs: int, gc_off: bool) -> None:
    """``--fair``: cycles/s with fairness on and off at 10 and 10,000 jobs; the shares."""
    many = tuple(Flow(f"sender_domain:f{i}.test", 1.0 + i % 2) for i in range(100))
    few = many[:3]
    cases: tuple[tuple[str, tuple[Flow, ...]], ...] = (
        ("fairness off          ", ()),
        ("fairness on, 3 flows  ", few),
        ("fairness on, 100 flows", many),
    )
    for jobs in (10, 10000):
        for label, fl in cases:
            results = [_run(jobs, max(50000, 20 * jobs), RCPTS, gc_off, fl) for _ in range(runs)]
            rates = [rate for rate, _ in results]
            rate = statistics.median(rates)
            gc_share = statistics.median(share for _, share in results)
            print(
                f"{jobs:>6} jobs in core, {label}: {rate:>10,.0f} select+done cycles/s "
                f"({1e6 / rate:.1f} us/cycle; runs {min(rates):,.0f}-{max(rates):,.0f}; "
                f"GC {gc_share:.0%})"
            )
    _fair_shares()


def main() -> None:
    """Print cycles/s per job count and the per-cycle cost ratio 10,000 : 10 jobs, both cases."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per figure; the median is printed")
    ap.add_argument("--gc-off", action="store_true", help="pause the cyclic GC while timing")
    ap.add_argument("--fair", action="store_true", help="fair queuing figures (module doc)")
    args = ap.parse_args()
    if args.fair:
        _fair_main(args.runs, args.gc_off)
        return
    print(
        f"qmgrd from {qmgrd.__file__}; median of {args.runs} runs; cyclic GC "
        f"{'paused while timing' if args.gc_off else 'on'}; cycles per CPU second"
    )
    cases = (
        ("plain jobs (10 entries each, below the preemption threshold):", RCPTS, 50000),
        # 20 entries >= minimum_delivery_slots x delivery_slot_cost = 15: the candidate search runs.
        ("preemptable jobs (20 entries each):", 20, 20000),
    )
    for title, rcpts, cycles in cases:
        print(title)
        results: dict[int, float] = {}
        for jobs in (10, 1000, 10000):
            runs = [
                _run(jobs, max(cycles, 20 * jobs), rcpts, args.gc_off) for _ in range(args.runs)
            ]
            rates = [rate for rate, _ in runs]
            results[jobs] = statistics.median(rates)
            gc_share = statistics.median(share for _, share in runs)
            print(
                f"{jobs:>6} jobs in core: {results[jobs]:>10,.0f} select+done cycles/s "
                f"({1e6 / results[jobs]:.1f} us/cycle; runs {min(rates):,.0f}-{max(rates):,.0f}; "
                f"GC {gc_share:.0%})"
            )
        print(f"per-cycle cost ratio 10,000 jobs / 10 jobs: {results[10] / results[10000]:.2f}")


if __name__ == "__main__":
    main()
