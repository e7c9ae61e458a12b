"""GCRA: the generic cell rate algorithm, a rate limit with a burst (pure, time passed in).

Contract
--------
A :class:`Gcra` admits events at ``rate`` per second on average with up to
``burst`` events back to back. It keeps one number, the theoretical arrival
time ``tat``: an event at ``now`` conforms when ``tat - tolerance <= now``
(``tolerance = (burst - 1) / rate``); taking it moves ``tat`` to
``max(tat, now) + 1 / rate``. ``allowed_at(now)`` is the earliest time the
next event conforms. The clock is always an argument: nothing here reads it.

Used by fair admission (``qmgrd.core.admission``) for the optional per-flow
message rate. It is the same limit as a token bucket of ``burst`` tokens
refilled at ``rate`` per second, with O(1) state.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from qmgrd.errors import InvariantError

__all__ = ["Gcra"]


@dataclass(slots=True, eq=False)
class Gcra:
    """One rate limit's state (see the module doc)."""

    rate: float  # events per second, > 0
    burst: float = 1.0  # events admitted back to back, >= 1
    tat: float = -math.inf  # theoretical arrival time of the next event

    def __post_init__(self) -> None:
        if not (self.rate > 0.0 and math.isfinite(self.rate)):
            raise InvariantError(f"GCRA rate {self.rate} is not a positive number")
        if not self.burst >= 1.0:
            raise InvariantError(f"GCRA burst {self.burst} is below 1")

    @property
    def interval(self) -> float:
        """Seconds between events at the sustained rate."""
        return 1.0 / self.rate

    @property
    def tolerance(self) -> float:
        """How far ahead of the sustained rate a burst may run (seconds)."""
        return (self.burst - 1.0) * self.interval

    def allowed_at(self, now: float) -> float:
        """The earliest time (>= now) at which the next event conforms."""
        return max(now, self.tat - self.tolerance)

    def conforms(self, now: float) -> bool:
        """Whether an event at ``now`` is within the rate."""
        return self.tat - self.tolerance <= now

    def take(self, now: float) -> None:
        """Count one event at ``now`` (callers check :meth:`conforms` first)."""
        self.tat = max(self.tat, now) + self.interval
