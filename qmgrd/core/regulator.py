"""The workqueue regulator: how many workers of a blocking-work pool may run (sans-IO).

Theory of operation (seeds/pthread-workqueue-regulator.txt)
-----------------------------------------------------------
Every worker of a pool is in exactly one state:

running   executing a job (or about to take the next one);
blocked   executing a job but inside a blocking call (fsync, a disk read): it
          uses no CPU, so it does not count against the target;
waiting   idle, ready to take the next job at once;
parked    a spare: not counted, woken only by the regulator.

The regulator keeps ``running + waiting == target`` (or below it with
``waiting > 0``: nobody needs more). When it is below the target, nobody is
waiting and jobs are queued (workers are blocked in I/O while work piles
up), a parked worker is woken -- or, with none parked and fewer than
``limit`` workers, a new one is started -- but only after the shortfall has
lasted ``quiet`` seconds (0.1 s, as the seed's kernel implementation): a
worker that blocks for a millisecond then must not make the pool grow
(flip-flops). Below ``target`` workers in all, a new one starts at once
whenever more jobs are queued than workers are running (the pool's base
size). When ``running + waiting`` overcommits (blocked workers
came back), a worker that finishes a job, or a waiting one asked to take
one, parks instead (the seed's quarantine: the overcommit is resolved by
the workers themselves, at job boundaries).

Contract: every method takes ``now`` (seconds, any monotonic origin) and
returns a decision; nothing here reads a clock, sleeps or touches a thread.
The adapter (``qmgrd.daemon.workpool``) calls :meth:`grow` after each event
and again at :meth:`deadline`. A transition from a state with no worker in
it is a bug: ``InvariantError`` naming the state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from qmgrd.errors import InvariantError

__all__ = ["QUIET_PERIOD", "Grow", "Next", "Regulator"]

QUIET_PERIOD = 0.1  # seconds the pool must be short of workers before it grows (the seed's)
_EPSILON = 1e-9  # a deadline reached in float arithmetic counts as reached


class Next(enum.Enum):
    """What a worker does after a job, or when asked to take one."""

    RUN = "run"  # take the next queued job
    WAIT = "wait"  # nothing queued: wait for a job
    PARK = "park"  # the pool overcommits: become a spare


class Grow(enum.Enum):
    """What the adapter must do to keep the pool at its target."""

    NONE = "none"
    UNPARK = "unpark"  # wake one parked worker
    SPAWN = "spawn"  # start one new worker


@dataclass(slots=True, eq=False)
class Regulator:
    """Counts per worker state and the queued jobs; decisions per the module doc."""

    target: int
    limit: int
    quiet: float = QUIET_PERIOD
    running: int = 0
    blocked: int = 0
    waiting: int = 0
    parked: int = 0
    queued: int = 0
    spawned: int = 0  # workers started (for metrics and tests)
    unparked: int = 0  # parked workers woken by the regulator
    _short_since: float | None = None  # start of the current shortfall, if any

    def __post_init__(self) -> None:
        if self.target < 1 or self.limit < self.target:
            raise InvariantError(f"regulator: target {self.target}, limit {self.limit}")

    # -- derived ----------------------------------------------------------------------

    @property
    def workers(self) -> int:
        """Every worker, whatever its state."""
        return self.running + self.blocked + self.waiting + self.parked

    @property
    def overcommit(self) -> int:
        """How many workers should park for ``running + waiting`` to be at the target."""
        return max(0, self.running + self.waiting - self.target)

    def _short(self) -> bool:
        return self.queued > 0 and self.waiting == 0 and self.running < self.target

    def _observe(self, now: float) -> None:
        """Start or end the shortfall period (it must last ``quiet`` without a break)."""
        if not self._short():
            self._short_since = None
        elif self._short_since is None:
            self._short_since = now

    def _take(self, state: str) -> None:
        count = getattr(self, state)
        if count <= 0:
            raise InvariantError(f"regulator: no worker is {state}")
        setattr(self, state, count - 1)

    # -- jobs ----------------------------------------------------------------------------

    def submitted(self, now: float, count: int = 1) -> None:
        """``count`` jobs were queued."""
        self.queued += count
        self._observe(now)

    # -- worker transitions ----------------------------------------------------------------

    def started(self, now: float) -> None:
        """A new worker (after ``SPAWN``) is running."""
        self.running += 1
        self.spawned += 1
        self._observe(now)

    def took(self, now: float) -> None:
        """A running worker dequeued a job."""
        if self.queued <= 0:
            raise InvariantError("regulator: a job taken from an empty queue")
        if self.running <= 0:
            raise InvariantError("regulator: no worker is running")
        self.queued -= 1
        self._observe(now)

    def block(self, now: float) -> None:
        """A running worker enters a blocking call."""
        self._take("running")
        self.blocked += 1
        self._observe(now)

    def unblock(self, now: float) -> None:
        """A blocked worker is back (running; the pool may now overcommit)."""
        self._take("blocked")
        self.running += 1
        self._observe(now)

    def finished(self, now: float) -> Next:
        """A running worker finished a job: run the next one, wait, or park."""
        if self.running <= 0:
            raise InvariantError("regulator: no worker is running")
        if self.running + self.waiting > self.target:
            self.running -= 1
            self.parked += 1
            decision = Next.PARK
        elif self.queued == 0:
            self.running -= 1
            self.waiting += 1
            decision = Next.WAIT
        else:
            return Next.RUN
        self._observe(now)
        return decision

    def wake(self, now: float) -> Next:
        """A waiting worker saw a job queued: take it (RUN) or, overcommitted, park."""
        self._take("waiting")
        if self.queued == 0:
            self.waiting += 1
            return Next.WAIT
        if self.running + self.waiting + 1 > self.target:
            self.parked += 1
            self._observe(now)
            return Next.PARK
        self.running += 1
        self._observe(now)
        return Next.RUN

    def unpark(self, now: float) -> None:
        """A parked worker woken by ``UNPARK`` is running."""
        self._take("parked")
        self.running += 1
        self.unparked += 1
        self._observe(now)

    def exited(self, now: float, state: str) -> None:
        """A worker in ``state`` ('waiting' or 'parked') ended (the pool is closing)."""
        if state not in ("waiting", "parked"):
            raise InvariantError(f"regulator: a worker cannot exit while {state}")
        self._take(state)
        self._observe(now)

    # -- growing ---------------------------------------------------------------------------

    def grow(self, now: float) -> Grow:
        """Whether to wake a spare or start a worker now (see the module doc)."""
        self._observe(now)
        if self._short_since is None:
            return Grow.NONE
        if self.workers < self.target and self.queued > self.running:
            return Grow.SPAWN  # base size: a job nobody is about to take
        if now - self._short_since < self.quiet - _EPSILON:
            return Grow.NONE
        if self.parked:
            self._short_since = now  # each further worker needs its own quiet period
            return Grow.UNPARK
        if self.workers < self.limit:
            self._short_since = now
            return Grow.SPAWN
        return Grow.NONE

    def deadline(self) -> float | None:
        """When :meth:`grow` may answer differently without another event; None: never."""
        if self._short_since is None:
            return None
        return self._short_since + self.quiet
