"""The seed's limiter experiment through the scheduler facade, learning off and on.

tests/unit/core/limitersim.py drives a real Scheduler against a server admitting 5 sessions
(421 beyond), with varying service times. Off, the facade reproduces the seed's rates (constant 1:
1/3, Postfix's code, tests/unit/core/test_window_sim.py); on, nothing is deferred and the server
is kept at its capacity.
"""

from __future__ import annotations

import pytest

from tests.unit.core.limitersim import run_limiter_sim

MESSAGES = 1200


@pytest.mark.parametrize(
    ("feedback", "expected"),
    [("1/concurrency", 1 / 6), ("1/sqrt_concurrency", 1 / 4), ("1", 1 / 3)],
)
def test_learning_off_reproduces_seed_rates(feedback: str, expected: float) -> None:
    """Without learning each refusal defers its recipients: 1/6, 1/4 and 1/3 of them, and the
    destination never dies with the default failed-cohort limit 1."""
    run = run_limiter_sim(feedback, learning=False, messages=MESSAGES)
    assert run.deferred_fraction == pytest.approx(expected, abs=0.02)
    assert run.deaths == 0


@pytest.mark.parametrize("feedback", ["1/concurrency", "1/sqrt_concurrency", "1"])
def test_learning_on_defers_nothing_at_full_capacity(feedback: str) -> None:
    """With learning a 421 while others work puts the entry back: at most 2 % deferred (here
    none), every recipient sent, and the server serves about 5 sessions all the time."""
    run = run_limiter_sim(feedback, learning=True, messages=MESSAGES)
    assert run.deferred_fraction <= 0.02
    assert run.sent == MESSAGES
    assert run.refused > 0  # the window still probes above the limit
    assert run.mean_sessions >= 4.8


def test_learning_on_nothing_gets_through_is_still_dead() -> None:
    """A server that refuses every session is a real failure with learning on too: the
    destination dies and every recipient is deferred, as without learning."""
    run = run_limiter_sim("1/concurrency", learning=True, messages=50, server_limit=0)
    assert run.sent == 0
    assert run.deferred == 50
    assert run.deaths >= 1


def test_lockstep_sessions_quantise_the_sqrt_cycle() -> None:
    """With exactly equal service times the simulated sessions complete together and the window
    grows only after a burst of five reports, so 1/sqrt_concurrency defers 1/6, not 1/4: why the
    simulation varies service times (the daemon's own timing noise does that end to end)."""
    run = run_limiter_sim("1/sqrt_concurrency", learning=False, messages=MESSAGES, jitter=0.0)
    assert run.deferred_fraction == pytest.approx(1 / 6, abs=0.02)
