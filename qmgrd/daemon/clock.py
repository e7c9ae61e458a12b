"""Clocks: the engine reads time once per event through one of these (STYLE §4).

Tests hand in a fake one (``tests.support.clock.FakeClock``) and move time with
``advance``, then wake the engine; nothing sleeps for real to let time pass. The
package itself holds no test code.
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
