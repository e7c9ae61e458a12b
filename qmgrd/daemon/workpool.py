"""A regulated thread pool for the daemon's blocking spool work (fsync, renames, reads).

Contract
--------
``await pool.run(fn)`` runs ``fn()`` in a worker thread and returns its
result (or raises its exception) on the caller's event loop. Jobs run in
submission order (several at once). How many threads run is decided by the
sans-IO :class:`qmgrd.core.regulator.Regulator`; this module only turns its
decisions into threads, conditions and a loop timer:

- a job submitted with ``blocking=True`` (the default: spool work is
  fsyncs and renames) counts as *blocked* while it runs, since a thread in
  a system call holds no CPU and no GIL; code run with ``blocking=False``
  may mark its own blocking sections with ``with pool.blocking():``;
- while every worker is blocked and jobs queue for 0.1 s, the pool grows by
  one (a parked spare first, else a new thread, up to ``limit``), again
  after each further 0.1 s of shortfall;
- when blocked workers come back and ``running + waiting`` exceeds the
  target, workers park at their next job boundary (spares, never destroyed
  until ``close``).

The regulator's state is guarded by one lock; the grow deadline is a timer
on the event loop of the first ``run`` caller (a pool serves one loop).
``close()`` lets queued jobs finish, then ends every thread (bounded wait);
jobs submitted while it runs are refused (``InvariantError``), later ones
start new threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from qmgrd.core.regulator import QUIET_PERIOD, Grow, Next, Regulator
from qmgrd.errors import InvariantError

__all__ = ["PoolCounts", "WorkPool"]

T = TypeVar("T")
_CLOSE_WAIT = 10.0  # seconds close() waits for each thread


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """The pool's state for metrics and tests."""

    running: int
    blocked: int
    waiting: int
    parked: int
    queued: int
    spawned: int
    unparked: int


@dataclass(slots=True, eq=False)
class _Job:
    fn: Callable[[], Any]
    blocking: bool
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _settle(future: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


class WorkPool:
    """Threads regulated to ``target`` running + waiting (see the module doc)."""

    def __init__(
        self,
        *,
        target: int | None = None,
        limit: int = 32,
        quiet: float = QUIET_PERIOD,
        clock: Callable[[], float] = time.monotonic,
        name: str = "qmgrd-io",
    ) -> None:
        """``target`` defaults to the number of CPUs (the seed's pwqr_create)."""
        target = target or os.cpu_count() or 2
        self._reg = Regulator(target=target, limit=max(limit, target), quiet=quiet)
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)  # waiting workers
        self._spares = threading.Condition(self._lock)  # parked workers
        self._unparks = 0  # wake-ups granted to parked workers, not yet taken
        self._jobs: deque[_Job] = deque()
        self._threads: list[threading.Thread] = []
        self._local = threading.local()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._arming = False  # an _arm is posted to the loop and has not run yet
        self._closing = False

    # -- the event-loop side ----------------------------------------------------------

    async def run(self, fn: Callable[[], T], *, blocking: bool = True) -> T:
        """Run ``fn`` in a worker thread; its result or exception comes back here."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closing:
                raise InvariantError("work submitted to a closed pool")
            if self._loop is None:
                self._loop = loop
            self._jobs.append(_Job(fn, blocking, loop, future))
            self._reg.submitted(self._clock())
            if self._reg.waiting:
                self._work.notify()
            self._regulate()
        return await future

    def counts(self) -> PoolCounts:
        """A consistent snapshot of the worker states."""
        with self._lock:
            r = self._reg
            return PoolCounts(
                r.running, r.blocked, r.waiting, r.parked, r.queued, r.spawned, r.unparked
            )

    @contextlib.contextmanager
    def blocking(self) -> Iterator[None]:
        """In a job run with ``blocking=False``: count this section as blocked."""
        if not getattr(self._local, "inside", False) or getattr(self._local, "blocked", False):
            yield
            return
        with self._lock:
            self._reg.block(self._clock())
            self._regulate()
        self._local.blocked = True
        try:
            yield
        finally:
            self._local.blocked = False
            with self._lock:
                self._reg.unblock(self._clock())

    def _regulate(self) -> None:
        """Apply the regulator's grow decisions (lock held); arm the deadline timer."""
        now = self._clock()
        for _ in range(self._reg.limit + 1):
            decision = self._reg.grow(now)
            if decision is Grow.SPAWN:
                self._reg.started(now)
                thread = threading.Thread(
                    target=self._worker, name=f"{self._name}-{self._reg.spawned}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            elif decision is Grow.UNPARK:
                self._reg.unpark(now)
                self._unparks += 1
                self._spares.notify()
            else:
                break
        if (
            self._reg.deadline() is not None
            and self._timer is None
            and not self._arming
            and self._loop is not None
        ):
            with contextlib.suppress(RuntimeError):  # a closed loop: nothing left to regulate
                self._loop.call_soon_threadsafe(self._arm)
                self._arming = True  # one wake-up of the loop until it has run _arm

    def _arm(self) -> None:
        """Loop thread: schedule a regulation at the regulator's deadline."""
        with self._lock:
            self._arming = False
            deadline = self._reg.deadline()
            if deadline is None or self._timer is not None or self._loop is None:
                return
            delay = max(0.0, deadline - self._clock())
            self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            self._regulate()

    def regulate(self) -> None:
        """Apply the regulator's decision now (the deadline timer does this by itself)."""
        with self._lock:
            self._regulate()

    # -- the worker threads -------------------------------------------------------------

    def _worker(self) -> None:
        self._local.inside = True
        state = Next.RUN
        with self._lock:
            while True:
                if state is Next.RUN:
                    if self._jobs:
                        job = self._jobs.popleft()
                        self._reg.took(self._clock())
                        self._execute(job)
                    state = self._reg.finished(self._clock())
                    self._regulate()
                elif state is Next.WAIT:
                    if self._closing and not self._jobs:
                        self._reg.exited(self._clock(), "waiting")
                        return
                    if not self._jobs:
                        self._work.wait()
                    if self._jobs:
                        state = self._reg.wake(self._clock())
                        self._regulate()
                else:  # parked
                    if self._unparks:
                        self._unparks -= 1
                        state = Next.RUN
                    elif self._closing:
                        self._reg.exited(self._clock(), "parked")
                        return
                    else:
                        self._spares.wait()

    def _execute(self, job: _Job) -> None:
        """Run one job with the lock released; hand its outcome to its loop."""
        if job.blocking:
            self._reg.block(self._clock())
            self._regulate()
            self._local.blocked = True
        self._lock.release()
        try:
            try:
                ok, value = True, job.fn()
            except BaseException as exc:  # handed back to the awaiting coroutine
                ok, value = False, exc
            with contextlib.suppress(RuntimeError):  # the caller's loop is gone
                job.loop.call_soon_threadsafe(_settle, job.future, ok, value)
        finally:
            self._lock.acquire()
            if job.blocking:
                self._local.blocked = False
                self._reg.unblock(self._clock())

    # -- stopping -----------------------------------------------------------------------

    def close(self) -> None:
        """Let queued jobs finish, then end every worker (waits at most ``_CLOSE_WAIT`` each)."""
        with self._lock:
            self._closing = True
            self._work.notify_all()
            self._spares.notify_all()
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(_CLOSE_WAIT)
        with self._lock:  # reusable: a daemon stopped and started again (tests) gets new threads
            self._threads = [t for t in self._threads if t.is_alive()]
            self._closing = False
            self._arming = False
            self._loop = None
