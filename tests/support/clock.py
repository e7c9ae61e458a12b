"""``FakeClock``: a clock that moves only when a test tells it to (STYLE §4).

It satisfies ``qmgrd.daemon.clock.Clock`` (``now()``) for the engine and is
also callable (``clock()``), the shape of the ``time.time``/``time.monotonic``
callables the listener and the SMTP agent take. Nothing sleeps to let time
pass: a test calls ``advance`` and then wakes whatever reads the clock.
"""

from __future__ import annotations


class FakeClock:
    """A clock that moves only when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        """Start at a fixed, realistic epoch time."""
        self._now = start

    def now(self) -> float:
        """The fake current time."""
        return self._now

    def __call__(self) -> float:
        """The fake current time, for collaborators that take a time callable."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError("a clock does not go backward")
        self._now += seconds
