"""Write flow control for our asyncio protocols (the listener's Channel, the client's Connection).

Contract
--------
The transport calls its protocol's ``pause_writing``/``resume_writing``; the protocol
forwards them to ``WriteFlow.pause``/``resume``. A writer that must not queue more awaits
``wait()`` while ``paused`` is True; ``resume`` wakes it, ``fail(exc)`` (the connection is
lost) raises ``exc`` in it. One waiter at a time: each protocol has one writer.
"""

from __future__ import annotations

import asyncio

__all__ = ["WriteFlow"]


class WriteFlow:
    """The transport's pause state and the one writer waiting for it to resume."""

    __slots__ = ("_waiter", "paused")

    def __init__(self) -> None:
        self.paused = False
        self._waiter: asyncio.Future[None] | None = None

    def pause(self) -> None:
        """The transport's buffer is over its high-water mark."""
        self.paused = True

    def resume(self) -> None:
        """The buffer drained below its low-water mark: wake the waiting writer."""
        self.paused = False
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, exc: BaseException) -> None:
        """The connection is gone: the waiting writer gets ``exc``."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def wait(self) -> asyncio.Future[None]:
        """A future that completes when writing may go on (await it only while paused)."""
        self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter
