"""The seed's active-limiter experiment through the scheduler facade (sans-IO, no clock).

``run_limiter_sim`` drives a real :class:`~qmgrd.core.Scheduler` the way the engine does: after
every event it selects entries until ``select`` returns None, and hands each to a server that
admits ``server_limit`` concurrent sessions. An admitted session completes after ``duration`` +/-
``jitter`` time units (seeded: a real server's service time varies, and exactly equal durations
keep the simulated sessions in lockstep, which quantises the feedback cycles; docs/limiter.md). A
refused one answers 421 at once and its outcome is applied before the next selection, as the
engine does with a 421 that arrives long before any delivery completes. Completions at the same
instant are all reported before the next selection, as the engine's loop does with completions
that arrive within one pass. Without learning (or when ``entry_throttled`` declines) the refusal
is ``entry_done(hop_failure=...)`` and its recipients count as deferred; with learning it is
``entry_throttled(kind="full")``.

Used by tests/unit/core/test_learned_limits_sim.py and bench/limiter.py.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass

from qmgrd.core import Entry, RecipientsDeferred, TransportParams
from qmgrd.core.feedback import parse_feedback
from tests.unit.core.schedsim import Sim

REFUSAL = ("4.7.0", "host sink[127.0.0.1] refused to talk to me: 421 4.7.0 Too many sessions")


@dataclass(frozen=True, slots=True)
class LimiterResult:
    """Counts of one simulated run."""

    sent: int
    deferred: int
    refused: int
    busy_time: float  # integral of admitted sessions over time
    elapsed: float
    deaths: int  # DestinationDead events

    @property
    def deferred_fraction(self) -> float:
        """Deferred recipients over all recipients (each was attempted once)."""
        return self.deferred / (self.sent + self.deferred)

    @property
    def mean_sessions(self) -> float:
        """Mean number of sessions the server was serving."""
        return self.busy_time / self.elapsed if self.elapsed else 0.0


def run_limiter_sim(
    feedback: str,
    *,
    learning: bool,
    messages: int = 3000,
    server_limit: int = 5,
    duration: float = 10.0,
    jitter: float = 5.0,
    seed: int = 1,
    cohort_limit: int = 1,
) -> LimiterResult:
    """Run the experiment with the same positive and negative ``feedback`` (module doc)."""
    fb, warning = parse_feedback(feedback)
    assert warning is None, warning
    params = TransportParams(
        destination_concurrency_limit=20,
        initial_destination_concurrency=5,
        positive_feedback=fb,
        negative_feedback=fb,
        failed_cohort_limit=cohort_limit,
        destination_concurrency_learning=learning,
    )
    sim = Sim({"smtp": params}, now=0.0)
    for i in range(messages):
        sim.add(f"m{i}", [("smtp", "dst.test")])
    rng = random.Random(seed)
    completions: list[tuple[float, int, Entry]] = []
    seq = sent = deferred = refused = deaths = 0
    busy_time = 0.0
    last = sim.now

    def account() -> int:
        nonlocal deaths
        n = 0
        for event in sim.drain_events():
            if isinstance(event, RecipientsDeferred):
                n += len(event.recipients)
            elif type(event).__name__ == "DestinationDead":
                deaths += 1
        return n

    for _ in range(20 * messages):  # every round completes or refuses one entry: bounded
        while (entry := sim.sched.select(sim.now)) is not None:
            if len(completions) < server_limit:
                seq += 1
                end = sim.now + duration + rng.uniform(-jitter, jitter)
                heapq.heappush(completions, (end, seq, entry))
                continue
            refused += 1
            if not sim.sched.entry_throttled(entry, kind="full", hop=REFUSAL, now=sim.now):
                deferred += len(entry.recipients)
                sim.sched.entry_done(entry, hop_failure=REFUSAL, now=sim.now)
            deferred += account()
        sim.serve_reads()
        if not completions:
            deadline = sim.sched.next_deadline()
            if deadline is None:
                break
            sim.now = deadline
            sim.sched.run_timers(sim.now)
            deferred += account()
            continue
        end = completions[0][0]
        busy_time += (end - last) * len(completions)
        last = sim.now = end
        while completions and completions[0][0] <= end:  # simultaneous ones in one pass
            entry = heapq.heappop(completions)[2]
            sim.sched.entry_done(entry, now=sim.now)
            sent += len(entry.recipients)
        deferred += account()
    assert sim.sched.message_count == 0, "simulation did not finish within its round budget"
    return LimiterResult(sent, deferred, refused, busy_time, sim.now, deaths)
