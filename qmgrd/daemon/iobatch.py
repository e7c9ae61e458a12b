"""Run blocking spool work off the event loop, many small jobs per thread hop.

Every delivery ends with a little file work (done marks, reason logs), every
message with a move or an unlink. One ``asyncio.to_thread`` per job would cost a
thread hop each; instead jobs submitted while a hop is under way are queued and
run together in the next hop. Up to ``workers`` hops run at once, so one slow
fsync does not hold up everything behind it.

Hops run on a regulated ``WorkPool`` when one is given (``pool=``; the daemon
shares one, see ``qmgrd.daemon.workpool``), else on asyncio's default executor.
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
        self, *, workers: int = 4, max_batch: int = 256, pool: WorkPool | None = None
    ) -> None:
        """``workers`` hops may run concurrently; each takes at most ``max_batch`` jobs."""
        self.pool = pool  # regulator: where hops run (None: asyncio's default executor)
        self._pending: list[_Job] = []
        self._workers = workers
        self._max_batch = max_batch
        self._running: set[asyncio.Task[None]] = set()
        self.hops = 0  # thread hops made (for benchmarks and tests)
        self.jobs = 0  # jobs run

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``fn`` to run in a worker thread; await the returned future for its result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._pending.append((fn, future))
        if len(self._running) < self._workers:
            task = loop.create_task(self._drain())
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        return future

    async def _drain(self) -> None:
        while self._pending:
            batch = self._pending[: self._max_batch]
            del self._pending[: self._max_batch]
            self.hops += 1
            self.jobs += len(batch)
            if self.pool is not None:  # regulator
                results = await self.pool.run(functools.partial(_run_all, batch))
            else:
                results = await asyncio.to_thread(_run_all, batch)
            for (_fn, future), (ok, value) in zip(batch, results, strict=True):
                if future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(value)

    async def wait_idle(self) -> None:
        """Wait until every submitted job has run."""
        while self._running:
            await asyncio.gather(*list(self._running), return_exceptions=True)
