"""``fmt_delay``: Postfix's delay text, two significant decimals, no trailing zeros."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from qmgrd.daemon.outcomes import delays, fmt_delay


def _reference(seconds: float) -> str:
    """The formatting rule written out plainly (the fast path must agree with it)."""
    seconds = max(0.0, seconds)
    if seconds >= 10:
        return f"{seconds:.0f}"
    if seconds >= 0.1:
        return f"{seconds:.1f}".rstrip("0").rstrip(".") or "0"
    return f"{seconds:.2f}".rstrip("0").rstrip(".") or "0"


@given(st.floats(allow_nan=True, allow_infinity=True) | st.floats(-0.01, 0.02))
@example(0.005)
@example(math.nextafter(0.005, 0.0))
@example(0.0049999999)
@example(-0.0)
def test_fast_path_agrees_with_the_rule(seconds: float) -> None:
    assert fmt_delay(seconds) == _reference(seconds)


def test_examples() -> None:
    assert [fmt_delay(x) for x in (0, 0.001, 0.006, 0.05, 0.1, 0.25, 1.04, 9.96, 12.4)] == [
        "0", "0", "0.01", "0.05", "0.1", "0.2", "1", "10", "12",
    ]  # fmt: skip


DELAYS = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-0.01, 0.02)


@given(DELAYS, DELAYS, DELAYS, DELAYS)
@example(0.005, math.nextafter(0.005, 0.0), math.nan, -0.0)
def test_delays_is_fmt_delay_of_each_part(
    before: float, in_active: float, conn_setup: float, transmission: float
) -> None:
    """``delays=a/b/c/d`` is fmt_delay of each of its four times (its "0"s without the call)."""

    class _Qf:
        arrival_time = 100.0

    class _Msg:
        qf = _Qf()
        queued_time = 100.0 + before

    msg = _Msg()
    started = msg.queued_time + in_active
    got = delays(msg, started, 0.0, conn_setup, transmission)  # type: ignore[arg-type]
    parts = (msg.queued_time - 100.0, started - msg.queued_time, conn_setup, transmission)
    assert got == "/".join(fmt_delay(x) for x in parts)
