"""Clocks: the engine reads time once per event through one of these (STYLE §4).

Tests use `FakeClock` and move time with `advance`, then wake the engine; nothing
sleeps for real to let time pass.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall-clock seconds since the epoch (queue timestamps, backoff, expiry)."""

    def now(self) -> float:
        """The current time."""
        ...


class SystemClock:
    """The real clock."""

    __slots__ = ()

    def now(self) -> float:
        """``time.time()``."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to."""

    __slots__ = ("_now",)

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        """Start at a fixed, realistic epoch time."""
        self._now = start

    def now(self) -> float:
        """The fake current time."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward (never backward)."""
        if seconds < 0:
            raise ValueError("a clock does not go backward")
        self._now += seconds
