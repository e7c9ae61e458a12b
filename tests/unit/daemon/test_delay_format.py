"""``fmt_delay``: Postfix's delay text, two significant decimals, no trailing zeros."""

from __future__ import annotations

import math

from hypothesis import example, given
from hypothesis import strategies as st

from qmgrd.daemon.outcomes import fmt_delay


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
