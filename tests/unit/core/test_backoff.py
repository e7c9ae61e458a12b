"""Retry timing, expiry and delay warnings (DESIGN §7, notes §9)."""

from __future__ import annotations

import pytest

from qmgrd.core.backoff import delay_warning_due, is_expired, next_attempt
from qmgrd.errors import InvariantError

T0 = 1_700_000_000.0


@pytest.mark.parametrize(
    ("age", "delay"),
    [(0, 300), (10, 300), (300, 300), (1000, 1000), (4000, 4000), (90000, 4000)],
)
def test_next_attempt_is_age_clamped(age: float, delay: float) -> None:
    """The retry delay is the message age clamped to [minimal, maximal] backoff."""
    now = T0 + age
    assert next_attempt(now, T0, 300, 4000) == now + delay


def test_next_attempt_doubles_age() -> None:
    """Retrying at each due time makes the age roughly double until the cap."""
    now, ages = T0 + 300, []
    for _ in range(6):
        now = next_attempt(now, T0, 300, 4000)
        ages.append(now - T0)
    assert ages == [600, 1200, 2400, 4800, 8800, 12800]


def test_next_attempt_minimum_wins_and_unknown_create_time() -> None:
    """A minimum above the maximum wins (Postfix clamps max first); create_time <= 0 -> min."""
    assert next_attempt(T0 + 100, T0, 500, 200) == T0 + 600
    assert next_attempt(T0, 0, 300, 4000) == T0 + 300
    with pytest.raises(InvariantError):
        next_attempt(T0, T0, -1, 10)


@pytest.mark.parametrize(
    ("age", "null_sender", "maximal", "bounce", "expired"),
    [
        (100, False, 432000, 432000, False),
        (432000, False, 432000, 432000, True),
        (431999, False, 432000, 3600, False),
        (3600, True, 432000, 3600, True),
        (3599, True, 432000, 3600, False),
        (100, True, 50, 3600, True),  # bounce lifetime capped at maximal
        (0, False, 0, 0, True),  # lifetime 0: try once
        (0, True, 432000, 0, True),
    ],
)
def test_is_expired(
    age: float, null_sender: bool, maximal: float, bounce: float, expired: bool
) -> None:
    """Expiry uses bounce_queue_lifetime (<= maximal) for null-sender mail, else maximal."""
    assert (
        is_expired(
            T0 + age,
            T0,
            null_sender=null_sender,
            maximal_queue_lifetime=maximal,
            bounce_queue_lifetime=bounce,
        )
        is expired
    )


@pytest.mark.parametrize(
    ("warn_time", "now", "due"),
    [
        (None, T0, False),
        (0, T0, False),
        (-1, T0, False),
        (T0 + 10, T0, False),
        (T0 + 1, T0, True),  # one second early, as Postfix
        (T0, T0, True),
        (T0 - 100, T0, True),
    ],
)
def test_delay_warning_due(warn_time: float | None, now: float, due: bool) -> None:
    """The notice is due from warn_time - 1; no/negative warn_time means never (or done)."""
    assert delay_warning_due(now, warn_time) is due
