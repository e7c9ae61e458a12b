"""Bounded waits for tests: on an event wherever the awaited change has one.

``Changes`` is the event-driven wait. An object a test watches (a sink, a fake
agent, captured logs, injected disk faults) calls ``notify()`` whenever its
state changes; ``await changes.wait_for(predicate, what)`` checks the
predicate now and again after each change, and fails with an
``AssertionError`` naming ``what`` after ``timeout`` seconds. ``notify`` may be
called from worker threads (the engine's file work runs in threads): it then
hands the wake-up to the loop.

``wait_until`` is the one polling wait, for state that changes with no event a
test can hear: another process's files or output, a listener's table of live
sessions, transports that finish closing on later loop turns. It re-checks
every ``interval`` seconds and fails after ``timeout``. Use it only there.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable

TIMEOUT = 20.0  # seconds: every wait fails after this unless told otherwise
POLL_INTERVAL = 0.01


class Changes:
    """Wake-ups for waiters on a watched object's state (see the module docstring)."""

    __slots__ = ("_loop", "_thread", "_waiters")

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def notify(self) -> None:
        """The watched state changed: every waiter re-checks its predicate."""
        loop = self._loop
        if loop is None or not self._waiters:
            return
        if threading.get_ident() == self._thread:
            self._wake()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait_for(
        self, predicate: Callable[[], bool], what: str, timeout: float = TIMEOUT
    ) -> None:
        """Return once ``predicate()`` holds; ``AssertionError`` after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        self._loop, self._thread = loop, threading.get_ident()
        try:
            async with asyncio.timeout(timeout):
                while True:
                    # Registered before the check: a change made by another thread between
                    # the check and the await still wakes this waiter.
                    waiter = loop.create_future()
                    self._waiters.add(waiter)
                    try:
                        if predicate():
                            return
                        await waiter
                    finally:
                        self._waiters.discard(waiter)
        except TimeoutError:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


async def wait_until(
    predicate: Callable[[], bool],
    what: str,
    timeout: float = TIMEOUT,
    interval: float = POLL_INTERVAL,
) -> None:
    """Poll ``predicate`` every ``interval`` until it holds; ``AssertionError`` after ``timeout``.

    Only for state with no event to wait on (see the module docstring).
    """
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
