"""The seed's active-limiter experiment end to end over loopback (bench/limiter.py).

A sink admitting 5 concurrent sessions (421 and hang-up beyond), the daemon with client limit
20 and initial concurrency 5: the share of first attempts deferred must match the seed's table
for 1/concurrency (16.5 %) and 1/sqrt_concurrency (24.5 %) and qmgrd's simulation for constant 1
(1/3: Postfix's code lowers the window by 2 on the first negative report, where the seed's
pseudocode lowers it by 1; tests/unit/core/test_window_sim.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.limiter import run_limiter


@pytest.mark.slow
@pytest.mark.parametrize(
    ("feedback", "expected"),
    [("1/concurrency", 0.165), ("1/sqrt_concurrency", 0.245), ("1", 1 / 3)],
)
async def test_limiter_defer_rate_without_learning(
    tmp_path: Path, feedback: str, expected: float
) -> None:
    """Learning off, each feedback defers the seed's (or the simulation's) share within 5 points,
    and the destination never dies (default failed-cohort limit 1)."""
    run = await run_limiter(tmp_path, feedback, messages=300)
    assert run.sent + run.deferred == 300
    assert run.deferred == run.refused  # every deferral is one 421, nothing else failed
    assert run.deferred_fraction == pytest.approx(expected, abs=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("feedback", ["1/concurrency", "1/sqrt_concurrency", "1"])
async def test_limiter_with_learning_defers_at_most_two_percent(
    tmp_path: Path, feedback: str
) -> None:
    """Learning on, a 421 while others work puts the entry back: at most 2 % of the recipients
    are deferred and every other one is delivered."""
    run = await run_limiter(tmp_path, feedback, messages=300, learning=True)
    assert run.sent + run.deferred == 300
    assert run.deferred_fraction <= 0.02
