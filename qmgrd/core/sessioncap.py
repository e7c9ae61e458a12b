"""The adaptive session cap: how many SMTP sessions one event loop serves at once (sans-IO).

Theory of operation
-------------------
Every live session adds its steps to each turn of the event loop, so past
some number of sessions every reply, every delivery step and the control
socket wait longer (the loop's lag grows), while the relay's rate does not
grow. The right number depends on the machine, the message sizes and what
else runs, so it is learned, the way the workqueue regulator
(``qmgrd.core.regulator``) keeps ``running + waiting`` at a target -- here
the target is the loop's lag:

- lag above ``lag_limit``: the cap drops to ``DECREASE`` times the sessions
  live now (multiplicative decrease, at most once per ``HOLD`` seconds so
  one slow turn is not punished twice), never below ``floor``;
- lag below half the limit while the cap binds (sessions at 90 % of it or
  more): the cap grows by ``INCREASE`` of itself plus one, never above
  ``ceiling`` (``smtpd_session_limit``);
- otherwise it stays.

A new connection is admitted while ``sessions < cap``; beyond, it gets
``421 4.3.2`` (``qmgrd.listener.inflow``). Sessions already live are never
cut. Contract: ``update(now, lag, sessions)`` is called periodically with
the loop's smoothed lag (seconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgrd.errors import InvariantError

__all__ = ["DECREASE", "HOLD", "INCREASE", "SessionCap"]

DECREASE = 0.75  # the cap after too much lag, as a share of the live sessions
INCREASE = 0.1  # growth per update while the cap binds and the loop keeps up
HOLD = 0.2  # seconds between two decreases


@dataclass(slots=True, eq=False)
class SessionCap:
    """The learned cap (see the module doc)."""

    ceiling: int
    lag_limit: float
    floor: int = 10
    cap: float = 0.0  # 0: start at the ceiling
    _cut_at: float | None = None

    def __post_init__(self) -> None:
        if self.floor < 1 or self.ceiling < 1:
            raise InvariantError(f"session cap: floor {self.floor}, ceiling {self.ceiling}")
        self.floor = min(self.floor, self.ceiling)
        if not self.cap:
            self.cap = float(self.ceiling)

    @property
    def limit(self) -> int:
        """Sessions admitted at most now."""
        return max(self.floor, min(self.ceiling, int(self.cap)))

    def admits(self, sessions: int) -> bool:
        """Whether one more session may start while ``sessions`` are live."""
        return self.lag_limit <= 0 or sessions < self.limit

    def update(self, now: float, lag: float, sessions: int) -> None:
        """Apply one observation of the loop's ``lag`` with ``sessions`` live."""
        if self.lag_limit <= 0:
            return
        if lag > self.lag_limit:
            if self._cut_at is None or now - self._cut_at >= HOLD:
                self.cap = max(float(self.floor), min(self.cap, sessions * DECREASE))
                self._cut_at = now
        elif lag < self.lag_limit / 2 and sessions >= 0.9 * self.limit:
            self.cap = min(float(self.ceiling), self.cap * (1 + INCREASE) + 1)

    def configure(self, ceiling: int, lag_limit: float) -> None:
        """Reload: new bounds; the learned cap is kept within them."""
        self.ceiling = max(1, ceiling)
        self.floor = min(self.floor, self.ceiling)
        self.lag_limit = lag_limit
        self.cap = min(self.cap, float(self.ceiling))
