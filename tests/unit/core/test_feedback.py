"""Concurrency window arithmetic (notes §7.1-§7.3): parsing, step sequences, states, properties."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.core.feedback import (
    SUSPENDED,
    THROTTLED,
    ConcurrencyWindow,
    Feedback,
    parse_feedback,
)
from qmgrd.errors import InvariantError

ONE = Feedback(1.0, "constant")
PER_N = Feedback(1.0, "concurrency")
PER_SQRT = Feedback(1.0, "sqrt_concurrency")


def make(
    *,
    init: int = 5,
    limit: int = 20,
    positive: Feedback = ONE,
    negative: Feedback = ONE,
    cohort_limit: int = 0,
) -> ConcurrencyWindow:
    """A window with the given settings (defaults: Postfix's, but no dead detection)."""
    return ConcurrencyWindow(
        init=init, limit=limit, positive=positive, negative=negative, cohort_limit=cohort_limit
    )


# --- parsing -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", Feedback(1.0, "constant")),
        ("0", Feedback(0.0, "constant")),
        ("0.5", Feedback(0.5, "constant")),
        ("1/4", Feedback(1.0, "constant", 4.0)),
        (" 1 / 4 ", Feedback(1.0, "constant", 4.0)),
        ("1/concurrency", Feedback(1.0, "concurrency")),
        ("1 / concurrency", Feedback(1.0, "concurrency")),
        ("0.5/concurrency", Feedback(0.5, "concurrency")),
        ("1/sqrt_concurrency", Feedback(1.0, "sqrt_concurrency")),
        ("2e-1", Feedback(0.2, "constant")),
    ],
)
def test_parse_feedback_valid(text: str, expected: Feedback) -> None:
    """Each accepted spelling parses to its Feedback without a warning."""
    assert parse_feedback(text) == (expected, None)


@pytest.mark.parametrize(
    "text",
    ["", "junk", "2", "-1", "2/concurrency", "3/2", "1/0", "1/cubic", "1 junk", "1/concurrency x"],
)
def test_parse_feedback_invalid_falls_back_to_one(text: str) -> None:
    """Unparsable or out-of-[0,1] values become constant 1 with a warning naming the value."""
    feedback, warning = parse_feedback(text)
    assert feedback == Feedback(1.0, "constant")
    assert warning is not None and repr(text) in warning


def test_feedback_value_by_kind() -> None:
    """value() evaluates N/M, N/window and N/sqrt(window) at the window it is given."""
    assert Feedback(1.0, "constant", 4.0).value(9) == 0.25
    assert Feedback(0.5, "concurrency").value(4) == 0.125
    assert Feedback(1.0, "sqrt_concurrency").value(9) == pytest.approx(1 / 3)
    with pytest.raises(InvariantError):
        PER_N.value(0)


def test_feedback_str_round_trips() -> None:
    """str() gives a spelling that parses back to the same value."""
    for fb in (ONE, PER_N, PER_SQRT, Feedback(1.0, "constant", 4.0), Feedback(0.5, "concurrency")):
        assert parse_feedback(str(fb)) == (fb, None)


def test_feedback_constructor_rejects_out_of_range() -> None:
    """A Feedback larger than 1 can only come from a bug, so construction refuses it."""
    with pytest.raises(InvariantError):
        Feedback(2.0, "constant")
    with pytest.raises(InvariantError):
        Feedback(2.0, "concurrency")


# --- step sequences ------------------------------------------------------------------------


def positive_run(w: ConcurrencyWindow, count: int, busy: int = 100) -> list[int]:
    """Windows after each of ``count`` positive reports."""
    out = []
    for _ in range(count):
        w.positive_feedback(busy)
        out.append(w.window)
    return out


def negative_run(w: ConcurrencyWindow, count: int) -> list[int]:
    """Windows after each of ``count`` negative reports."""
    out = []
    for _ in range(count):
        w.negative_feedback()
        out.append(w.window)
    return out


def test_positive_constant_one_grows_every_report_and_clamps() -> None:
    """g=1: every positive report adds 1 until the limit, then the window stays at the limit."""
    w = make(init=5, limit=8)
    assert positive_run(w, 5) == [6, 7, 8, 8, 8]
    assert (w.success, w.failure) == (0.0, 0.0)


def test_positive_one_per_concurrency_grows_once_per_pseudo_cohort() -> None:
    """g=1/N: the window grows at the END of N reports (5 reports at 5, then 6 at 6)."""
    w = make(init=5, positive=PER_N)
    assert positive_run(w, 11) == [5, 5, 5, 5, 6, 6, 6, 6, 6, 6, 7]
    assert w.success == pytest.approx(0.0, abs=1e-9)


def test_positive_sqrt_truncates_as_the_seed() -> None:
    """g=1/sqrt(N) truncates (seed algorithm): 2 reports at 4, 3 at 5 (3*0.447>=1), 2 at 6."""
    w = make(init=4, positive=PER_SQRT)
    assert positive_run(w, 7) == [4, 5, 5, 5, 6, 6, 7]
    assert w.success == pytest.approx(2 * 0.5 - 1 + 3 / math.sqrt(5) - 1 + 2 / math.sqrt(6) - 1)


def test_positive_one_per_concurrency_rounds_to_nearest_step() -> None:
    """g=1/N keeps Postfix's f/2 rounding: at 3, 3 reports reach 1.0 and the window grows."""
    w = make(init=3, positive=PER_N)
    assert positive_run(w, 3) == [3, 3, 4]


def test_positive_resets_failure_only_on_growth() -> None:
    """A positive report clears failure only when the window grows; fail_cohorts always."""
    w = make(init=5, positive=PER_N, cohort_limit=3)
    w.negative_feedback()
    assert (w.window, w.failure) == (3, 1.0)
    w.positive_feedback(busy=10)
    assert w.fail_cohorts == 0.0
    assert w.failure == 1.0  # no growth yet (success 1/3)
    positive_run(w, 2, busy=10)
    assert (w.window, w.failure) == (4, 0.0)


def test_negative_one_first_report_drops_window_by_two() -> None:
    """f=1 with failure==0: the first negative report lowers the window by 2, later ones by 1."""
    w = make(init=10)
    assert negative_run(w, 4) == [8, 7, 6, 5]
    assert (w.success, w.failure) == (0.0, 1.0)


def test_negative_one_after_growth_drops_by_two_again() -> None:
    """Growth resets failure to 0, so the next negative report drops the window by 2 again."""
    w = make(init=10)
    w.negative_feedback()
    w.positive_feedback(busy=10)
    assert (w.window, w.failure) == (9, 0.0)
    w.negative_feedback()
    assert w.window == 7


def test_negative_one_per_concurrency_acts_at_start_of_run() -> None:
    """f=1/N: the first report of a run lowers the window at once (reverse hysteresis)."""
    w = make(init=10, limit=20, negative=PER_N)
    assert negative_run(w, 9) == [9, 9, 9, 9, 9, 9, 9, 9, 8]
    assert w.failure == pytest.approx(1.0 + 0.9 - 8 / 9)


def test_negative_sqrt_sequence() -> None:
    """f=1/sqrt(N): one step at the first report, then about sqrt(N) reports per step."""
    w = make(init=9, negative=PER_SQRT)
    assert negative_run(w, 6) == [8, 8, 7, 7, 7, 6]


def test_negative_floor_is_one_and_keeps_cycle() -> None:
    """The window never goes below 1 while READY; the negative cycle keeps running there."""
    w = make(init=2)
    assert negative_run(w, 3) == [1, 1, 1]
    assert w.ready and w.failure == 1.0


def test_success_reset_by_negative_step_only() -> None:
    """A negative report that lowers the window clears success; one that does not, keeps it."""
    w = make(init=10, positive=PER_N, negative=PER_N)
    w.positive_feedback(busy=10)
    assert w.success == pytest.approx(0.1)
    w.negative_feedback()  # first of a run: steps down, clears success
    assert (w.window, w.success) == (9, 0.0)
    w.positive_feedback(busy=10)
    w.negative_feedback()  # inside the run: no step
    assert w.window == 9
    assert w.success == pytest.approx(1 / 9)


# --- safety rule and limits ---------------------------------------------------------------


def test_safety_rule_blocks_growth_beyond_busy_plus_init() -> None:
    """Positive feedback is ignored unless window < busy + init (the window can't run ahead)."""
    w = make(init=5)
    assert positive_run(w, 3, busy=0) == [5, 5, 5]
    assert w.success == 0.0
    assert positive_run(w, 3, busy=1) == [6, 6, 6]
    assert positive_run(w, 2, busy=3) == [7, 8]


def test_safety_rule_still_clears_fail_cohorts() -> None:
    """A positive report that the safety rule ignores still clears fail_cohorts."""
    w = make(init=5, cohort_limit=2)
    w.negative_feedback()
    assert w.fail_cohorts == pytest.approx(0.2)
    w.positive_feedback(busy=0)
    assert w.fail_cohorts == 0.0


def test_unlimited_limit_grows_without_bound() -> None:
    """limit 0 means unlimited: the window passes 20 with g=1."""
    w = make(init=5, limit=0)
    assert positive_run(w, 30)[-1] == 35


def test_constructor_checks_settings() -> None:
    """init must be >= 1 and <= a non-zero limit; the window starts READY at init."""
    assert make(init=3, limit=0).window == 3
    bad: list[Callable[[], ConcurrencyWindow]] = [
        lambda: make(init=0),
        lambda: make(init=6, limit=5),
        lambda: make(limit=-1),
        lambda: make(cohort_limit=-1),
    ]
    for build in bad:
        with pytest.raises(InvariantError):
            build()


# --- dead destinations ----------------------------------------------------------------------


def test_cohort_death_at_defaults() -> None:
    """Defaults (f=1, cohort limit 1) at window 5: 5 -> 3 -> 2 -> dead after three reports."""
    w = make(init=5, cohort_limit=1)
    assert [w.negative_feedback(), w.window] == [False, 3]
    assert [w.negative_feedback(), w.window] == [False, 2]
    assert [w.negative_feedback(), w.window] == [True, THROTTLED]
    assert w.throttled and not w.ready and w.state == "throttled"


def test_window_one_dies_on_first_negative_report() -> None:
    """With cohort limit 1 a queue at window 1 dies on its first failure."""
    w = make(init=1, cohort_limit=1)
    assert w.negative_feedback() is True
    assert w.window == 0


def test_cohort_limit_counts_pseudo_cohorts() -> None:
    """Cohort limit 2 with f=1/N from window 4: each failure adds 1/window; dead at >= 2."""
    w = make(init=4, negative=PER_N, cohort_limit=2)
    steps = [(w.negative_feedback(), w.window) for _ in range(6)]
    # fail_cohorts: 1/4, +1/3, +1/3, +1/2, +1/2 (= 1.92), +1/1 -> dead on the sixth report
    assert steps == [(False, 3), (False, 3), (False, 2), (False, 2), (False, 1), (True, 0)]
    assert w.fail_cohorts == pytest.approx(1 / 4 + 2 / 3 + 1 + 1)


def test_cohort_limit_zero_never_dies() -> None:
    """cohort limit 0 disables dead detection: the window bottoms out at 1."""
    w = make(init=3)
    negative_run(w, 50)
    assert w.window == 1


def test_positive_feedback_revives_dead_window_to_busy() -> None:
    """A success from an in-flight delivery revives a dead queue at window = busy."""
    w = make(init=5, cohort_limit=1)
    negative_run(w, 3)
    assert w.throttled
    assert w.positive_feedback(busy=3) is True
    assert (w.window, w.success, w.failure, w.fail_cohorts) == (3, 0.0, 0.0, 0.0)


def test_positive_feedback_revives_dead_window_to_init_when_idle() -> None:
    """With nothing in flight, revival by positive feedback restores the initial window."""
    w = make(init=5, cohort_limit=1)
    negative_run(w, 3)
    assert w.positive_feedback(busy=0) is True
    assert w.window == 5
    assert w.positive_feedback(busy=0) is False


def test_revival_by_busy_respects_a_lowered_limit() -> None:
    """If a reload lowered the limit below the busy count, revival stops at the limit."""
    w = make(init=4, limit=8, cohort_limit=1)
    negative_run(w, 3)
    w.update_limits(init=2, limit=2, positive=ONE, negative=ONE, cohort_limit=1)
    w.positive_feedback(busy=5)
    assert w.window == 2


def test_revive_by_timer() -> None:
    """revive() (minimal_backoff_time timer or flush) restores init and clears accumulators."""
    w = make(init=4, cohort_limit=1, negative=PER_N)
    while not w.throttled:
        w.negative_feedback()
    w.revive()
    assert (w.window, w.success, w.failure, w.fail_cohorts) == (4, 0.0, 0.0, 0.0)
    with pytest.raises(InvariantError):
        w.revive()


def test_negative_feedback_requires_ready() -> None:
    """Negative feedback on a dead or suspended window is a bug (InvariantError names it)."""
    w = make(init=1, cohort_limit=1)
    w.negative_feedback()
    with pytest.raises(InvariantError, match="throttled"):
        w.negative_feedback()


# --- rate-delay suspension ------------------------------------------------------------------


def test_suspend_and_resume() -> None:
    """Window 1 -> SUSPENDED (-1) -> resume -> 1; other transitions raise InvariantError."""
    w = make(init=1, limit=1)
    w.suspend()
    assert (w.window, w.suspended, w.ready, w.state) == (SUSPENDED, True, False, "suspended")
    with pytest.raises(InvariantError, match="suspended"):
        w.positive_feedback(busy=0)
    with pytest.raises(InvariantError, match="suspended"):
        w.negative_feedback()
    with pytest.raises(InvariantError):
        w.suspend()
    w.resume()
    assert w.window == 1 and w.ready
    with pytest.raises(InvariantError):
        w.resume()


def test_suspend_requires_window_one() -> None:
    """Suspending a window above 1 is a bug: rate-delayed transports run at concurrency 1."""
    with pytest.raises(InvariantError):
        make(init=2).suspend()


# --- reload ---------------------------------------------------------------------------------


def test_update_limits_clamps_live_window() -> None:
    """A reload with a lower limit clamps a READY window; new feedback applies at once."""
    w = make(init=5)
    positive_run(w, 5)
    assert w.window == 10
    w.update_limits(init=2, limit=6, positive=PER_N, negative=PER_N, cohort_limit=1)
    assert (w.window, w.init, w.positive) == (6, 2, PER_N)
    w.update_limits(init=2, limit=0, positive=PER_N, negative=PER_N, cohort_limit=1)
    assert w.window == 6


def test_update_limits_keeps_dead_state() -> None:
    """A dead window stays dead across a reload and later revives at the new init."""
    w = make(init=1, cohort_limit=1)
    w.negative_feedback()
    w.update_limits(init=3, limit=10, positive=ONE, negative=ONE, cohort_limit=1)
    assert w.throttled
    w.revive()
    assert w.window == 3
    with pytest.raises(InvariantError):
        w.update_limits(init=4, limit=3, positive=ONE, negative=ONE, cohort_limit=1)


# --- properties -----------------------------------------------------------------------------

feedbacks = st.one_of(
    st.builds(
        Feedback,
        st.floats(0.0, 1.0, allow_nan=False),
        st.sampled_from(["concurrency", "sqrt_concurrency"]),
    ),
    st.builds(
        lambda n, d: Feedback(n, "constant", d),
        st.floats(0.0, 1.0, allow_nan=False),
        st.sampled_from([1.0, 2.0, 3.0, 4.0, 10.0]),
    ),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("pos"), st.integers(0, 60)),
        st.tuples(st.just("neg"), st.just(0)),
        st.tuples(st.just("revive"), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=300, deadline=None)
@given(
    limit=st.integers(0, 40),
    init_raw=st.integers(1, 40),
    positive=feedbacks,
    negative=feedbacks,
    cohort_limit=st.integers(0, 4),
    ops=operations,
)
def test_window_invariants_under_random_feedback(
    limit: int,
    init_raw: int,
    positive: Feedback,
    negative: Feedback,
    cohort_limit: int,
    ops: list[tuple[str, int]],
) -> None:
    """Any feedback sequence keeps 1 <= window <= limit while READY, obeys the safety rule,
    moves at most one step up per report, and keeps the accumulators bounded."""
    init = min(init_raw, limit) if limit else init_raw
    w = make(
        init=init, limit=limit, positive=positive, negative=negative, cohort_limit=cohort_limit
    )
    for op, busy in ops:
        before = w.window
        if op == "pos":
            revived = w.positive_feedback(busy)
            if before == THROTTLED:
                expected = busy if busy > 0 else init
                assert revived and w.window == (min(expected, limit) if limit else expected)
            else:
                assert not revived
                assert before <= w.window <= before + 1
                if before >= busy + init:
                    assert w.window == before  # the safety rule
            assert w.fail_cohorts == 0.0
        elif op == "neg" and w.ready:
            died = w.negative_feedback()
            assert died == w.throttled
            assert not died or cohort_limit > 0
            assert w.window <= before
        elif op == "revive" and w.throttled:
            w.revive()
            assert w.window == init
        assert w.window >= THROTTLED
        if w.ready:
            assert w.window >= 1
            assert limit == 0 or w.window <= limit
            assert -0.5 <= w.success < 1.0
            assert 0.0 <= w.failure < 1.5
            assert cohort_limit == 0 or w.fail_cohorts < cohort_limit
        assert w.fail_cohorts >= 0.0
