"""The adaptive session cap: down when a window's worst lag passes the target, up while the
loop keeps up and the cap binds; a simulated loop settles where its lag stays under the limit."""

from __future__ import annotations

import pytest

from qmgrd.core.sessioncap import DECREASE, FLOOR, HOLD, INCREASE, TARGET, SessionCap
from qmgrd.errors import InvariantError

T0 = 100.0
LIMIT = 0.05
OVER = LIMIT * TARGET * 1.01  # just over the target: a cut
TICK = 0.1  # the regulator's update period


def test_starts_at_the_ceiling_and_admits_below_it() -> None:
    """Before any lag the cap is smtpd_session_limit."""
    cap = SessionCap(ceiling=100, lag_limit=LIMIT)
    assert cap.limit == 100
    assert cap.admits(99) and not cap.admits(100)


def test_a_window_over_the_target_cuts_from_the_live_sessions_once_per_hold() -> None:
    """Worst lag over half the limit (not only over the limit): multiplicative decrease from
    the sessions live, not from the old cap; one cut per HOLD; never below the floor."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT)
    cap.update(T0, LIMIT * TARGET, 400)  # at the target: no cut
    assert cap.limit == 1000
    cap.update(T0, OVER, 400)
    assert cap.limit == int(400 * DECREASE)
    cap.update(T0 + HOLD / 2, 1.0, 300)  # the same slow stretch: not cut twice
    assert cap.limit == int(400 * DECREASE)
    cap.update(T0 + HOLD, 1.0, 300)
    assert cap.limit == int(300 * DECREASE)
    for i in range(50):
        cap.update(T0 + HOLD * (2 + i), 1.0, 5)
    assert cap.limit == FLOOR
    assert cap.admits(FLOOR - 1) and not cap.admits(FLOOR)


def test_a_clock_that_went_back_does_not_block_cuts() -> None:
    """A cut 'in the future' (clock stepped back) does not hold the next one forever."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT)
    cap.update(T0, OVER, 500)
    cap.update(T0 - 10, OVER, 500)
    assert cap.limit == int(int(500 * DECREASE) * DECREASE)


@pytest.mark.parametrize(
    ("worst", "sessions", "grows"),
    [
        (0.01, 100, True),  # keeps up (under half the target), cap binds
        (0.01, 80, False),  # keeps up, cap does not bind: no reason to grow
        (0.02, 100, False),  # between half the target and the target: hold
    ],
)
def test_growth_only_while_the_loop_keeps_up_and_the_cap_binds(
    worst: float, sessions: int, grows: bool
) -> None:
    """Multiplicative-plus-one increase, only when it is needed and safe."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT, cap=100)
    cap.update(T0, worst, sessions)
    assert cap.limit == (int(100 * (1 + INCREASE) + 1) if grows else 100)


def test_growth_stops_at_the_ceiling_and_zero_limit_turns_it_off() -> None:
    """Never above smtpd_session_limit; in_flow_lag_limit = 0 admits up to nothing but it."""
    cap = SessionCap(ceiling=40, lag_limit=LIMIT, cap=10)
    assert cap.limit == FLOOR  # a cap below the floor admits the floor
    for i in range(30):
        cap.update(T0 + i, 0.0, cap.limit)
    assert cap.limit == 40
    off = SessionCap(ceiling=20, lag_limit=0.0)
    off.update(T0, 5.0, 20)
    assert off.admits(10_000)
    cap.configure(5, LIMIT)  # reload lowers the ceiling, and the floor with it
    assert cap.limit == 5
    with pytest.raises(InvariantError):
        SessionCap(ceiling=0, lag_limit=LIMIT)


def _loop_lag(sessions: int) -> float:
    """A model loop: each live session adds 0.5 ms to the worst turn of a window."""
    return 0.0005 * sessions


@pytest.mark.parametrize("start", [1000, 20])
def test_a_model_loop_settles_where_its_worst_lag_stays_under_the_limit(start: int) -> None:
    """Offered far more sessions than it can serve, the cap settles around the sessions whose
    lag is the target (50 here): the lag stays under the limit once settled, whether the cap
    starts at the ceiling or at the floor."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT, cap=start)
    settled = []
    for i in range(600):  # 60 s of ticks
        sessions = cap.limit  # a flood: every free place is taken at once
        cap.update(T0 + i * TICK, _loop_lag(sessions), sessions)
        if i >= 300:
            settled.append(sessions)
    assert max(_loop_lag(n) for n in settled) <= LIMIT
    assert min(settled) >= FLOOR and max(settled) <= 60
