"""The adaptive session cap: down when the loop lags, up while it keeps up and the cap binds."""

from __future__ import annotations

import pytest

from qmgrd.core.sessioncap import HOLD, SessionCap
from qmgrd.errors import InvariantError

T0 = 100.0
LIMIT = 0.05


def test_starts_at_the_ceiling_and_admits_below_it() -> None:
    """Before any lag the cap is smtpd_session_limit."""
    cap = SessionCap(ceiling=100, lag_limit=LIMIT)
    assert cap.limit == 100
    assert cap.admits(99) and not cap.admits(100)


def test_lag_cuts_the_cap_to_three_quarters_of_live_sessions_once_per_hold() -> None:
    """Too much lag: multiplicative decrease from the sessions live, not from the old cap."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT)
    cap.update(T0, 0.2, 400)
    assert cap.limit == 300
    cap.update(T0 + HOLD / 2, 0.2, 300)  # the same slow stretch: not cut twice
    assert cap.limit == 300
    cap.update(T0 + HOLD, 0.2, 300)
    assert cap.limit == 225
    for i in range(50):
        cap.update(T0 + HOLD * (2 + i), 1.0, 5)
    assert cap.limit == 10  # the floor
    assert cap.admits(9) and not cap.admits(10)


@pytest.mark.parametrize(
    ("lag", "sessions", "grows"),
    [
        (0.01, 10, True),  # keeps up, cap binds
        (0.01, 5, False),  # keeps up, cap does not bind: no reason to grow
        (0.03, 10, False),  # between half the limit and the limit: hold
    ],
)
def test_growth_only_while_the_loop_keeps_up_and_the_cap_binds(
    lag: float, sessions: int, grows: bool
) -> None:
    """Additive-multiplicative increase, only when it is needed and safe."""
    cap = SessionCap(ceiling=1000, lag_limit=LIMIT, cap=10)
    cap.update(T0, lag, sessions)
    assert (cap.limit > 10) is grows


def test_growth_stops_at_the_ceiling_and_zero_limit_turns_it_off() -> None:
    """Never above smtpd_session_limit; in_flow_lag_limit = 0 admits up to nothing but it."""
    cap = SessionCap(ceiling=20, lag_limit=LIMIT, cap=10)
    for i in range(30):
        cap.update(T0 + i, 0.0, cap.limit)
    assert cap.limit == 20
    off = SessionCap(ceiling=20, lag_limit=0.0)
    off.update(T0, 5.0, 20)
    assert off.admits(10_000)
    cap.configure(5, LIMIT)  # reload lowers the ceiling
    assert cap.limit == 5
    with pytest.raises(InvariantError):
        SessionCap(ceiling=0, lag_limit=LIMIT)
