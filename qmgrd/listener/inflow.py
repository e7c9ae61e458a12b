"""Intake regulation at the listener: Postfix's ``in_flow_delay`` and 421 4.3.2 when overloaded.

Contract
--------
The listener asks an :class:`IntakeGate` (``ListenerContext.inflow``;
:data:`OPEN_GATE`, which admits everything at once, when none is set) two
questions, each a one-line hook:

- ``admit_session()`` at accept (``server._admit``): False means over
  capacity or at the session cap (``qmgrd.core.sessioncap``: the sessions
  this process's loop serves without lagging); the client gets
  ``421 4.3.2 Service currently unavailable`` (Postfix's code and
  wording) and is closed before a session exists; the log line counts
  refusals, at most one line a second (``note_refusals``). True counts the
  connection as *pending* until the listener calls ``started()`` (its
  session began, or it ended before that): the cap compares live plus
  pending sessions, so a burst accepted in one wake-up cannot pass it
  before the first of its sessions has started;
- ``await admit_message()`` at MAIL (``commands.mail``): first the same
  capacity check (False: ``421 4.3.2 ...`` and the session ends), then
  ``in_flow_delay``: the session takes one token; with none available it
  waits for one, at most ``in_flow_delay`` seconds, and then goes on
  anyway. Postfix's master skeleton does the same per cleanup connection,
  i.e. per message (``mail_flow_get(1)``, else ``doze(in_flow_delay)``);
  Postfix sleeps the whole delay, we stop waiting as soon as a token
  arrives.

:class:`TokenGate` is the real gate. What it needs crosses process
boundaries through a narrow interface, so a listener may run in a worker
process (``qmgrd.daemon.intakeflow`` is the queue manager's side):

1. the read end of the token pipe, a file descriptor: the queue manager
   writes one byte per token (as Postfix's qmgr does into its flow pipe);
   any process holding the read end takes tokens with a non-blocking
   ``read``. Inherited over ``fork`` or passed with ``SCM_RIGHTS``;
2. ``overloaded()``, a callable answering whether the relay is over
   capacity now (in one process a closure over the queue manager's state
   and this loop's lag; in a worker, over the backlog verdict the queue
   manager sends over the notify channel, ``intakeflow.WorkerRegulator``,
   and that worker's own loop lag);
3. ``session_full()``, a callable: this process's session cap, learned from
   its own loop's lag and its own live sessions (nothing shared).

Nothing else crosses. Waiting sessions are woken by one reader callback on
the pipe (one per gate, not per session), oldest first.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Callable
from typing import Protocol

from qmgrd.errors import InvariantError

__all__ = ["OPEN_GATE", "OVERLOAD_REPLY", "IntakeGate", "RefusalNotes", "TokenGate"]

OVERLOAD_REPLY = "421 4.3.2 Service currently unavailable"
_READ_MAX = 4096  # bytes (tokens) taken from the pipe per wake-up at most
_NOTE_INTERVAL = 1.0  # seconds between log lines about refusals


class RefusalNotes:
    """Refusals counted one by one and logged as one line with a count, one a second at most.

    Under overload hundreds of connections a second are refused; one log
    line each would spend the CPU the refusals are meant to save (Postfix
    logs one warning per throttled event class, not one per client).
    """

    __slots__ = ("_clock", "_noted", "_unnoted")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._noted: float | None = None  # when the last line was logged
        self._unnoted = 0  # refusals since

    def add(self) -> None:
        """Count one refusal."""
        self._unnoted += 1

    def take(self) -> int:
        """Refusals to log now: all since the last line, at most one line per second; else 0."""
        if not self._unnoted:
            return 0
        now = self._clock()
        if self._noted is not None and 0 <= now - self._noted < _NOTE_INTERVAL:
            return 0
        count, self._unnoted, self._noted = self._unnoted, 0, now
        return count


class IntakeGate(Protocol):
    """What the listener asks before a session and before each message (module doc)."""

    def admit_session(self) -> bool:
        """False: over capacity, refuse the connection with ``OVERLOAD_REPLY``."""
        ...

    def note_refusals(self) -> int:
        """How many refusals to report in a log line now (0: none, rate-limited)."""
        ...

    def started(self) -> None:
        """A connection ``admit_session`` admitted began its session, or ended before."""
        ...

    async def admit_message(self) -> bool:
        """Pause up to ``in_flow_delay`` for a token; False: over capacity, 421 and end."""
        ...


class _OpenGate:
    """The gate of a listener nobody regulates: everything is admitted at once."""

    __slots__ = ()

    def admit_session(self) -> bool:
        """Always."""
        return True

    async def admit_message(self) -> bool:
        """Always, without a pause."""
        return True

    def note_refusals(self) -> int:
        """Never any."""
        return 0

    def started(self) -> None:
        """Nothing is counted."""


OPEN_GATE: IntakeGate = _OpenGate()


class TokenGate:
    """Tokens from the queue manager's pipe, capacity from ``overloaded`` (module doc)."""

    __slots__ = (
        "_loop",
        "_notes",
        "_reading",
        "_waiters",
        "delay",
        "fd",
        "overloaded",
        "paused",
        "pending",
        "refused",
        "session_full",
        "timeouts",
    )

    def __init__(
        self,
        fd: int,
        *,
        delay: float,
        overloaded: Callable[[], bool] = lambda: False,
        session_full: Callable[[], bool] = lambda: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``fd``: the pipe's read end (made non-blocking here); ``delay``: in_flow_delay."""
        os.set_blocking(fd, False)
        self._notes = RefusalNotes(clock)  # the log line's count (note_refusals)
        self.fd = fd
        self.delay = delay
        self.overloaded = overloaded
        self.session_full = session_full
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reading = False
        self.paused = 0  # messages that had to wait for a token
        self.timeouts = 0  # ... and went on without one after in_flow_delay
        self.refused = 0  # sessions and messages refused with 421 4.3.2
        self.pending = 0  # connections admitted whose session has not begun yet

    def admit_session(self) -> bool:
        """False (counted) when over capacity or at this process's session cap."""
        if self.overloaded() or self.session_full():
            self._refuse()
            return False
        self.pending += 1
        return True

    def started(self) -> None:
        """An admitted connection is no longer pending (module doc)."""
        if self.pending < 1:
            raise InvariantError("intake gate: started() without a pending admission")
        self.pending -= 1

    def _refuse(self) -> None:
        self.refused += 1
        self._notes.add()

    def note_refusals(self) -> int:
        """Refusals to log now: all since the last line, at most one line per second; else 0
        (:class:`RefusalNotes`)."""
        return self._notes.take()

    async def admit_message(self) -> bool:
        """Capacity first, then a token (waiting at most ``delay``); see the module doc."""
        if self.overloaded():
            self._refuse()
            return False
        if self.delay <= 0 or self._take(1):
            return True
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        self._watch(loop)
        self.paused += 1
        try:
            await asyncio.wait_for(waiter, self.delay)
        except TimeoutError:
            self.timeouts += 1  # Postfix goes on after the delay too
        finally:
            if not waiter.done():
                waiter.cancel()
        return True

    def _take(self, count: int) -> int:
        """Tokens read from the pipe, at most ``count`` (0 when it is empty)."""
        try:
            return len(os.read(self.fd, count))
        except (BlockingIOError, InterruptedError):
            return 0

    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._reading:
            self._loop = loop
            loop.add_reader(self.fd, self._on_tokens)
            self._reading = True

    def _on_tokens(self) -> None:
        """The pipe is readable: one token per live waiter, oldest first."""
        if any(w.done() for w in self._waiters):  # timed out meanwhile
            self._waiters = deque(w for w in self._waiters if not w.done())
        want = min(len(self._waiters), _READ_MAX)
        for _ in range(self._take(want) if want else 0):
            self._waiters.popleft().set_result(None)
        if not self._waiters and self._loop is not None:
            self._loop.remove_reader(self.fd)
            self._reading = False

    def close(self) -> None:
        """Stop watching the pipe (the owner closes the descriptor)."""
        if self._reading and self._loop is not None:
            self._loop.remove_reader(self.fd)
            self._reading = False
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()
