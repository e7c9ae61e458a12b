"""Supervised tasks: every task the engine starts, and what a failure in one of them means.

Contract
--------
``TaskSupervisor(on_done, on_bug)``: ``spawn(coro, delivery=False)`` starts a
task and keeps it (deliveries apart, so shutdown can give them
``shutdown_timeout``); when a task ends ``on_done()`` is called (the loop
runs a pass). Every per-message step catches its own failures, so an
exception that escapes a task is a bug: ``on_bug(exc)`` is called with it
(the engine stops; see ``qmgrd.daemon.engine``). Cancellation is not a
failure.

``await shutdown(timeout, log)`` gives deliveries, then the other tasks,
``timeout`` seconds each to end and cancels the rest: a delivery cancelled
leaves its recipients R in ``active/`` (the next start recovers them), a
finish cancelled while it waits for a notice leaves the file in ``active/``.
``busy`` says whether any task is running.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["TaskSupervisor"]


class TaskSupervisor:
    """The engine's tasks (see the module doc)."""

    def __init__(
        self, on_done: Callable[[], None], on_bug: Callable[[BaseException], None]
    ) -> None:
        """``on_done``: a task ended; ``on_bug``: one ended with an exception."""
        self.tasks: set[asyncio.Task[None]] = set()
        self.deliveries: set[asyncio.Task[None]] = set()
        self._on_done = on_done
        self._on_bug = on_bug

    @property
    def busy(self) -> bool:
        """Whether any supervised task is running."""
        return bool(self.tasks or self.deliveries)

    def spawn(self, coro: Coroutine[Any, Any, None], *, delivery: bool = False) -> None:
        """Start ``coro`` as a supervised task."""
        task = asyncio.get_running_loop().create_task(coro)
        (self.deliveries if delivery else self.tasks).add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.deliveries.discard(task)
        if not task.cancelled():
            exc = task.exception()
            if exc is not None:
                self._on_bug(exc)
        self._on_done()

    async def shutdown(self, timeout: float, log: Any) -> None:
        """Let deliveries, then other tasks, end within ``timeout`` each; cancel the rest."""
        cancelled = await _settle(self.deliveries, timeout)
        if cancelled:
            log.warning(
                "deliveries cancelled at shutdown; their recipients stay queued", count=cancelled
            )
        await _settle(self.tasks, timeout)


async def _settle(tasks: set[asyncio.Task[None]], timeout: float) -> int:
    if not tasks:
        return 0
    _done, pending = await asyncio.wait(set(tasks), timeout=timeout)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)
    return len(pending)
