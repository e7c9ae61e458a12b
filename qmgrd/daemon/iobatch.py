"""Run blocking spool work off the event loop, many small jobs per thread hop.

Every delivery ends with a little file work (done marks, reason logs), every
message with a load, a move or an unlink. One ``asyncio.to_thread`` per job
would cost a thread hop each, and each hop is paid several times over: the
worker's wake-up, the result's wake-up of the loop, and a hand-over of the
interpreter lock at every system call the worker makes while the loop thread
runs (a futex wait and wake each). So jobs are batched:

- while no hop runs, a submitted job starts one at once (no added latency);
- while a hop runs, submitted jobs queue, and they all go together in the next
  hop, which the running drain starts as soon as its hop ends. The results of
  a hop come back to the loop with one wake-up;
- a job that has queued for ``stall`` seconds behind a running hop (a slow
  fsync, a stalled disk, a big batch) starts another hop beside it, up to
  ``workers`` hops at once, so one slow job never holds up everything behind
  it for long.

Jobs run in submission order within a hop; hops that run side by side may
interleave. A job's exception is raised to its awaiting coroutine. Hops run on
a regulated ``WorkPool`` when one is given (``pool=``; the daemon shares one,
see ``qmgrd.daemon.workpool``), else on asyncio's default executor.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # regulator: the pool is optional
    from qmgrd.daemon.workpool import WorkPool

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "asyncio.Future[Any]"]

STALL = 0.005  # seconds a job may queue behind a running hop before another hop starts


def _run_all(jobs: list[_Job]) -> list[tuple[bool, Any]]:
    out: list[tuple[bool, Any]] = []
    for fn, _future in jobs:
        try:
            out.append((True, fn()))
        except BaseException as exc:  # handed back to the awaiting coroutine
            out.append((False, exc))
    return out


class IoBatcher:
    """Batches blocking callables into worker-thread hops; results come back as futures."""

    def __init__(
        self,
        *,
        workers: int = 4,
        max_batch: int = 256,
        pool: WorkPool | None = None,
        stall: float = STALL,
    ) -> None:
        """At most ``workers`` hops run at once, each with at most ``max_batch`` jobs; a job
        queued ``stall`` seconds behind a running hop starts another (module doc)."""
        self.pool = pool  # regulator: where hops run (None: asyncio's default executor)
        self._pending: list[_Job] = []
        self._workers = workers
        self._max_batch = max_batch
        self._stall = stall
        self._stall_timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._live: set[asyncio.Task[None]] = set()  # drains started and not ended
        self.hops = 0  # thread hops made (for benchmarks and tests)
        self.jobs = 0  # jobs run

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn`` to run in a worker thread; await the returned future for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((fn, future))
        if not self._draining:
            self._start(loop)
        elif self._stall_timer is None and self._draining < self._workers:
            self._stall_timer = loop.call_later(self._stall, self._stalled, loop)
        return future

    @property
    def _draining(self) -> int:
        """Drains started and not ended (``_running`` lags a turn behind their end)."""
        return len(self._live)

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        task = loop.create_task(self._drain())  # counted now: its first step runs next turn
        self._live.add(task)
        self._running.add(task)
        task.add_done_callback(self._reap)

    def _reap(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._live.discard(task)  # a drain cancelled before it ran never reached its finally

    def _stalled(self, loop: asyncio.AbstractEventLoop) -> None:
        """Jobs queued ``stall`` seconds behind the running hops: one more hop for them."""
        self._stall_timer = None
        if self._pending and self._draining < self._workers:
            self._start(loop)

    async def _drain(self) -> None:
        try:
            while self._pending:
                batch = self._pending[: self._max_batch]
                del self._pending[: self._max_batch]
                if not self._pending and self._stall_timer is not None:
                    self._stall_timer.cancel()  # nothing waits any more
                    self._stall_timer = None
                self.hops += 1
                self.jobs += len(batch)
                try:
                    if self.pool is not None:  # regulator
                        results = await self.pool.run(functools.partial(_run_all, batch))
                    else:
                        results = await asyncio.to_thread(_run_all, batch)
                except asyncio.CancelledError:
                    for _fn, future in batch:
                        future.cancel()
                    raise
                except Exception as exc:  # the hop itself failed (a closed pool): its jobs did
                    for _fn, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_fn, future), (ok, value) in zip(batch, results, strict=True):
                    if future.done():
                        continue
                    if ok:
                        future.set_result(value)
                    else:
                        future.set_exception(value)
        finally:
            # Synchronously with the last check of ``_pending``: a job submitted from now on
            # starts a drain of its own (a done callback would run a turn later).
            task = asyncio.current_task()
            if task is not None:
                self._live.discard(task)

    async def wait_idle(self) -> None:
        """Wait until every submitted job has run."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
