"""Scheduler throughput: select + entry_done cycles per second with 10, 1,000 and 10,000 jobs.

One transport, 1,000 destinations, messages of 10 recipients to 10 distinct destinations (so a
job has 10 entries, below the default preemption threshold of 15 entries). Each finished message
is replaced by a new one, so the number of jobs in core stays constant; the replacement
(message_create + recipients_add) is part of the measured cost. Prints numbers, asserts nothing.

Run: .venv/bin/python bench/scheduler.py
"""

from __future__ import annotations

import time

from qmgrd.core import (
    MessageDone,
    ResolvedRecipient,
    Scheduler,
    SchedulerParams,
    TransportParams,
)

DESTINATIONS = 1000
RCPTS = 10


def _run(jobs: int, cycles: int, rcpts: int = RCPTS) -> float:
    """Return cycles per second with ``jobs`` messages of ``rcpts`` entries kept in core."""
    sp = SchedulerParams(qmgr_message_active_limit=jobs, qmgr_message_recipient_limit=jobs * rcpts)
    tp = TransportParams(process_limit=0, recipient_limit=jobs * rcpts * 2)
    sched = Scheduler(sp, lambda name: tp)
    now = 1000.0
    serial = 0

    def add() -> None:
        nonlocal serial
        qid = f"m{serial}"
        base = serial * 7
        serial += 1
        msg = sched.message_create(qid, queued_time=now, rcpt_unread=rcpts)
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
    start = time.perf_counter()
    done = 0
    while done < cycles:
        entry = sched.select(now)
        if entry is None:
            raise RuntimeError("nothing to select")
        sched.entry_done(entry, now=now)
        done += 1
        for ev in sched.pop_events():
            if isinstance(ev, MessageDone):
                add()
        now += 0.001
    elapsed = time.perf_counter() - start
    return cycles / elapsed


def main() -> None:
    """Print cycles/s per job count and the per-cycle cost ratio 10,000 : 10 jobs."""
    results: dict[int, float] = {}
    for jobs in (10, 1000, 10000):
        best = max(_run(jobs, 50000) for _ in range(3))
        results[jobs] = best
        print(
            f"{jobs:>6} jobs in core: {best:>10,.0f} select+done cycles/s "
            f"({1e6 / best:.1f} us/cycle)"
        )
    ratio = results[10] / results[10000]
    print(f"per-cycle cost ratio 10,000 jobs / 10 jobs: {ratio:.2f}")
    # Preemptable jobs (20 entries >= minimum_delivery_slots x delivery_slot_cost = 15): the
    # candidate search runs; it is linear in the jobs after the current one, cached as Postfix's.
    print("preemptable jobs (20 entries each):")
    pre: dict[int, float] = {}
    for jobs in (10, 1000, 10000):
        pre[jobs] = max(_run(jobs, 20000, rcpts=20) for _ in range(2))
        print(f"{jobs:>6} jobs in core: {pre[jobs]:>10,.0f} select+done cycles/s")
    print(f"per-cycle cost ratio 10,000 jobs / 10 jobs: {pre[10] / pre[10000]:.2f}")


if __name__ == "__main__":
    main()
