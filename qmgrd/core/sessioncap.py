"""The adaptive session cap: how many SMTP sessions one event loop serves at once (sans-IO).

Theory of operation
-------------------
Every live session adds its steps to each turn of the event loop, so past
some number of sessions every reply, every delivery step and the control
socket wait longer (the loop's lag grows), while the relay's rate does not
grow: a worker serving 360 messages a second needs a few dozen sessions, not
hundreds. The right number depends on the machine, the message sizes and
what else runs, so it is learned, the way the workqueue regulator
(``qmgrd.core.regulator``) keeps ``running + waiting`` at a target -- here
the target is the loop's lag. ``in_flow_lag_limit`` is what the lag's p99
must stay under, so the cap steers the *worst* lag of each observation
window (every sample since the last update, and how overdue the next one
is) to ``TARGET`` of that limit, an AIMD loop:

- worst lag above ``TARGET * lag_limit``: the cap drops to ``DECREASE``
  times the sessions live now (or the cap, if lower; multiplicative
  decrease), at most once per ``HOLD`` seconds: sessions already live go on
  after a cut, so its effect shows only as they end; never below ``floor``;
- worst lag below half of that while the cap binds (sessions at 90 % of it
  or more): the cap grows by ``INCREASE`` of itself plus one session;
  never above ``ceiling`` (``smtpd_session_limit``);
- otherwise it stays.

A new connection is admitted while ``sessions < cap``; beyond, it gets
``421 4.3.2`` (``qmgrd.listener.inflow``). Sessions already live are never
cut. Contract: ``update(now, worst, sessions)`` is called periodically with
the window's worst lag (seconds); nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgrd.errors import InvariantError

__all__ = ["DECREASE", "FLOOR", "HOLD", "INCREASE", "TARGET", "SessionCap"]

TARGET = 0.5  # the worst lag the cap steers to, as a share of in_flow_lag_limit
DECREASE = 0.8  # the cap after too much lag, as a share of the live sessions
INCREASE = 0.02  # growth per update while the cap binds and the loop keeps up
HOLD = 0.5  # seconds between two decreases (a cut shows only as live sessions end)
FLOOR = 20  # sessions always admitted (below, the lag is not the sessions')


@dataclass(slots=True, eq=False)
class SessionCap:
    """The learned cap (see the module doc)."""

    ceiling: int
    lag_limit: float
    floor: int = FLOOR
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

    @property
    def target(self) -> float:
        """The worst lag per window the cap steers to (seconds)."""
        return self.lag_limit * TARGET

    def admits(self, sessions: int) -> bool:
        """Whether one more session may start while ``sessions`` are live."""
        return self.lag_limit <= 0 or sessions < self.limit

    def update(self, now: float, worst: float, sessions: int) -> None:
        """Apply one window's ``worst`` lag with ``sessions`` live."""
        if self.lag_limit <= 0:
            return
        target = self.target
        if worst > target:
            if self._cut_at is None or not 0 <= now - self._cut_at < HOLD:
                self.cap = max(float(self.floor), min(self.cap, sessions) * DECREASE)
                self._cut_at = now
        elif worst < target / 2 and sessions >= 0.9 * self.limit:
            self.cap = min(float(self.ceiling), max(self.cap, self.floor) * (1 + INCREASE) + 1)

    def configure(self, ceiling: int, lag_limit: float) -> None:
        """Reload: new bounds; the learned cap is kept within them."""
        self.ceiling = max(1, ceiling)
        self.floor = min(self.floor, self.ceiling)
        self.lag_limit = lag_limit
        self.cap = min(self.cap, float(self.ceiling))
