"""Destination concurrency window and feedback arithmetic (notes §2.2, §7, §13.1).

Contract
--------
``parse_feedback(text)`` turns a ``*_destination_concurrency_{positive,negative}_feedback`` value
into a :class:`Feedback`; it never raises: a bad value becomes constant 1 plus a warning text the
caller logs (Postfix does the same, notes §7.1).

``ConcurrencyWindow`` holds one destination queue's window, its feedback accumulators and its dead
state. The owner (the scheduler's destination queue) calls:

- ``positive_feedback(busy)`` after a delivery that completed without a hop-status failure. ``busy``
  is the queue's busy entry count *including* the entry that just completed (Postfix calls
  ``queue_unthrottle`` before ``entry_done``). A THROTTLED window is revived by it.
- ``negative_feedback()`` after a destination-level failure; the window must be READY.
- ``suspend()`` / ``resume()`` around ``destination_rate_delay`` pauses.
- ``settle(observed)`` when learning is on and a session was refused while ``observed`` others
  to the destination were working: the destination is full, not failing (module
  :mod:`qmgrd.core.scheduler`, ``entry_throttled``); ``hold(resume_window)`` pauses a READY window
  after a throttling reply and ``resume()`` then brings it back at ``resume_window``.
- ``revive()`` when the ``minimal_backoff_time`` timer fires or on flush.
- ``update_limits(...)`` on configuration reload.

The owner keeps the dead reason and the timers; this module has no clock and no I/O.

States (notes §13.1): the window *is* the state. ``window > 0`` READY (that many concurrent
deliveries allowed), ``0`` THROTTLED (dead destination), ``-1`` SUSPENDED (rate delay). Any other
value is a bug. Every transition checks the state first and raises ``InvariantError`` naming it.

Theory of operation (Postfix 2.5 concurrency feedback, seed SCHEDULER_README)
----------------------------------------------------------------------------
Each positive report adds g(window) to ``success``; each negative report subtracts f(window) from
``failure``. Hysteresis is 1: the window moves by one step whenever an accumulator crosses 1.
Positive feedback moves the window up at the *end* of a run of 1/g reports, negative feedback moves
it down at the *start* of a run of 1/f reports (the "reverse" cycle): ``failure`` rests at or above
0, so the first negative report of a run already crosses it. Both loops use a tolerance of half a
feedback step (``+ f/2`` / ``- f/2``) exactly as Postfix's ``qmgr_queue.c`` does, which rounds to
the nearest step rather than truncating (``sqrt_concurrency``, a seed-only feedback, truncates as
the seed's algorithm does: ``Feedback.tolerance``); with the default constant negative feedback 1
and
``failure == 0`` it makes the first negative report drop the window by 2 (notes §13.4). Only a
window change resets the *other* accumulator.

Dead-destination detection is separate: every negative report adds 1/window to ``fail_cohorts``
(one "pseudo-cohort" is ``window`` deliveries); reaching ``cohort_limit`` kills the destination.
Every positive report clears ``fail_cohorts``.

Learned limits (``destination_concurrency_learning``): a refusal while others are working is no
feedback at all. ``settle`` lowers the window to the observed number of working sessions (never
raises it) and clears both accumulators, so positive feedback probes one step above the limit again
only after a full run of successes; ``fail_cohorts`` is left alone, because nothing failed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Literal

from qmgrd.errors import InvariantError

__all__ = [
    "READY_MIN",
    "SUSPENDED",
    "THROTTLED",
    "ConcurrencyWindow",
    "Feedback",
    "parse_feedback",
]

READY_MIN = 1
"""Smallest window value that means READY; any window >= this allows that many deliveries."""
THROTTLED = 0
"""Window value of a dead destination (notes §2.2)."""
SUSPENDED = -1
"""Window value of a destination paused by ``destination_rate_delay`` (notes §7.5)."""

FeedbackKind = Literal["constant", "concurrency", "sqrt_concurrency"]

# Postfix bounds the N/M denominator to [1/INT_MAX, INT_MAX] (notes §7.1).
_INT_MAX = 2**31 - 1
_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_FEEDBACK_RE = re.compile(
    rf"^\s*(?P<num>{_NUMBER})\s*(?:/\s*(?P<den>{_NUMBER}|concurrency|sqrt_concurrency))?\s*$"
)


@dataclass(frozen=True, slots=True)
class Feedback:
    """A parsed ``<t>_destination_concurrency_{positive,negative}_feedback`` value.

    ``constant`` is ``numerator / denominator`` whatever the window; ``concurrency`` is
    ``numerator / window`` and ``sqrt_concurrency`` is ``numerator / sqrt(window)``, evaluated with
    the window at the time of each report (Postfix's ``QMGR_FEEDBACK_VAL``).
    """

    numerator: float
    kind: FeedbackKind
    denominator: float = 1.0

    def __post_init__(self) -> None:
        """Reject values outside what ``parse_feedback`` can produce: a caller bug."""
        if not (self.numerator >= 0.0 and self.denominator > 0.0):
            raise InvariantError(
                f"feedback {self.numerator}/{self.denominator}: numerator must be >= 0 and "
                "denominator > 0"
            )
        if self.kind == "constant" and self.numerator / self.denominator > 1.0:
            raise InvariantError(f"constant feedback {self.numerator}/{self.denominator} > 1")
        if self.kind != "constant" and self.numerator > 1.0:
            raise InvariantError(f"feedback {self.numerator}/{self.kind}: numerator > 1")

    def value(self, window: int) -> float:
        """The feedback amount for one report at this window (window must be >= 1)."""
        if window < READY_MIN:
            raise InvariantError(f"feedback evaluated at non-ready window {window}")
        if self.kind == "constant":
            return self.numerator / self.denominator
        if self.kind == "concurrency":
            return self.numerator / window
        return self.numerator / math.sqrt(window)

    def tolerance(self, step: float) -> float:
        """How far short of a whole step an accumulator may be and still move the window.

        Postfix's code rounds to the nearest step (``step / 2``) and we copy it for every
        feedback Postfix implements. ``sqrt_concurrency`` exists only in the seed (Postfix's
        code rejects it; DESIGN §9 keeps it), so it follows the seed's published algorithm,
        which truncates (tolerance 0): that is the arithmetic behind the seed's measured and
        theoretical 1/(1+roundup(1/feedback)) = 1/4 defer rate at a 5-session server, where
        half-step rounding would give 1/3 (tests/unit/core/test_window_sim.py).
        """
        return 0.0 if self.kind == "sqrt_concurrency" else step / 2

    def __str__(self) -> str:
        """The configuration spelling, for logs and ``postconf`` output."""
        num = f"{self.numerator:g}"
        if self.kind == "constant":
            return num if self.denominator == 1.0 else f"{num}/{self.denominator:g}"
        return f"{num}/{self.kind}"


_FALLBACK = Feedback(1.0, "constant")


def parse_feedback(text: str) -> tuple[Feedback, str | None]:
    """Parse a feedback setting; return (feedback, warning text or None).

    Accepted: ``N``, ``N/M``, ``N/concurrency`` and ``N/sqrt_concurrency`` (whitespace allowed
    around ``/``). The effective value must lie in [0, 1]. Anything else yields constant 1 and a
    warning, as Postfix does (notes §7.1), so a typo never stops the daemon. Deliberate differences:
    ``N/sqrt_concurrency`` is accepted (DESIGN §9), and trailing junk such as ``"0.5 junk"`` is
    rejected instead of being silently ignored by ``sscanf``.
    """
    match = _FEEDBACK_RE.match(text)
    if match is None:
        return _FALLBACK, f"bad concurrency feedback value {text!r}; using 1"
    numerator = float(match["num"])
    den = match["den"]
    if den is None:
        kind: FeedbackKind = "constant"
        denominator = 1.0
    elif den in ("concurrency", "sqrt_concurrency"):
        kind = "concurrency" if den == "concurrency" else "sqrt_concurrency"
        denominator = 1.0
    else:
        kind = "constant"
        denominator = float(den)
        if not 1.0 / _INT_MAX <= denominator <= _INT_MAX:
            return _FALLBACK, f"bad concurrency feedback denominator in {text!r}; using 1"
    effective = numerator / denominator
    if not 0.0 <= effective <= 1.0:
        return _FALLBACK, f"concurrency feedback {text!r} is outside [0, 1]; using 1"
    return Feedback(numerator, kind, denominator), None


@dataclass(slots=True, eq=False)
class ConcurrencyWindow:
    """A destination queue's window, feedback accumulators and dead state (notes §7.2, §7.3).

    ``init`` must already be clamped to ``limit`` (and to 1 when a rate delay forces the limit to
    1); the constructor checks it. ``limit`` 0 means unlimited; ``cohort_limit`` 0 means the
    destination is never declared dead by feedback.
    """

    init: int
    limit: int
    positive: Feedback
    negative: Feedback
    cohort_limit: int
    window: int = field(init=False, default=0)
    success: float = 0.0
    failure: float = 0.0
    fail_cohorts: float = 0.0
    resume_to: int = READY_MIN  # the window ``resume`` restores (``hold`` sets it)

    def __post_init__(self) -> None:
        """Validate the settings and start READY at the initial concurrency."""
        _check_settings(self.init, self.limit, self.cohort_limit)
        self.window = self.init

    @property
    def ready(self) -> bool:
        """True when deliveries may start (up to ``window`` at once)."""
        return self.window >= READY_MIN

    @property
    def throttled(self) -> bool:
        """True when the destination is dead (the owner holds the reason and the timer)."""
        return self.window == THROTTLED

    @property
    def suspended(self) -> bool:
        """True while a ``destination_rate_delay`` pause is in progress."""
        return self.window == SUSPENDED

    @property
    def state(self) -> str:
        """The state's name, for logs and error messages."""
        if self.window >= READY_MIN:
            return "ready"
        if self.window == THROTTLED:
            return "throttled"
        if self.window == SUSPENDED:
            return "suspended"
        return f"invalid({self.window})"

    def positive_feedback(self, busy: int) -> bool:
        """Apply one positive report (notes §7.2, Postfix ``qmgr_queue_unthrottle``).

        ``busy`` counts the queue's in-flight deliveries including the one reporting. A dead window
        is revived to ``busy`` (or ``init`` when nothing is in flight) with fresh accumulators:
        "back from the almost grave, best concurrency is anyone's guess". Returns True iff it
        revived. A READY window grows only below ``limit`` and only while
        ``window < busy + init`` (the safety rule: growth must not run ahead of real use, or later
        negative feedback would act too late).
        """
        if busy < 0:
            raise InvariantError(f"positive feedback with busy={busy}")
        if not (self.ready or self.throttled):
            raise InvariantError(f"positive feedback on a {self.state} destination window")
        self.fail_cohorts = 0.0
        if self.throttled:
            self.window = busy if busy > 0 else self.init
            # busy never exceeds a non-zero limit unless a reload lowered it; keep the limit.
            if self.limit > 0 and self.window > self.limit:
                self.window = self.limit
            self.success = self.failure = 0.0
            return True
        if (self.limit == 0 or self.limit > self.window) and self.window < busy + self.init:
            f = self.positive.value(self.window)
            self.success += f
            # Round to the nearest step (tolerance f/2), exactly as Postfix; f <= 1 bounds this
            # loop to two iterations. (sqrt feedback truncates: see Feedback.tolerance.)
            while self.success + self.positive.tolerance(f) >= 1.0:
                self.window += 1
                self.success -= 1.0
                self.failure = 0.0
            if self.limit > 0 and self.window > self.limit:
                self.window = self.limit
        return False

    def negative_feedback(self) -> bool:
        """Apply one negative report (notes §7.3, Postfix ``qmgr_queue_throttle``).

        The window must be READY. Returns True iff the destination just died (window 0); the
        caller then records the reason, starts the ``minimal_backoff_time`` timer and defers the
        queue's todo entries.
        """
        if not self.ready:
            raise InvariantError(f"negative feedback on a {self.state} destination window")
        self.fail_cohorts += 1.0 / self.window
        if self.cohort_limit > 0 and self.fail_cohorts >= self.cohort_limit:
            self.window = THROTTLED
            return True
        f = self.negative.value(self.window)
        self.failure -= f
        # The reverse hysteresis cycle: failure rests >= 0, so the first report of a run already
        # lowers the window. Tolerance f/2 as Postfix (with f == 1 and failure == 0 this lowers the
        # window by 2). failure gains 1 per pass and f <= 1, so at most two passes.
        while self.failure - self.negative.tolerance(f) < 0.0:
            self.window -= 1
            self.success = 0.0
            self.failure += 1.0
        if self.window < READY_MIN:
            self.window = READY_MIN
        return False

    # --- cluster (qmgrd.daemon.destgate): a verdict reached by another node ---
    def kill(self) -> None:
        """READY -> THROTTLED: another node declared the destination dead (shared destdb)."""
        if not self.ready:
            raise InvariantError(f"kill of a {self.state} destination window")
        self.window = THROTTLED
        self.success = self.failure = 0.0

    # --- end cluster ---
    def suspend(self) -> None:
        """READY with window 1 -> SUSPENDED, at the end of a rate-delayed delivery (notes §7.5)."""
        if self.window != READY_MIN:
            raise InvariantError(
                f"suspend of a {self.state} destination window {self.window} (need ready, 1)"
            )
        self.window = SUSPENDED
        self.resume_to = READY_MIN

    def hold(self, resume_window: int) -> None:
        """READY -> SUSPENDED after a throttling reply; ``resume`` restores ``resume_window``.

        ``resume_window`` is clamped to [1, the current window]: a pause never raises the window.
        """
        if not self.ready:
            raise InvariantError(f"hold of a {self.state} destination window")
        self.resume_to = max(READY_MIN, min(resume_window, self.window))
        self.success = self.failure = 0.0
        self.window = SUSPENDED

    def resume(self) -> None:
        """SUSPENDED -> READY when the pause has passed: window 1 after a rate delay, the held
        window after ``hold``."""
        if not self.suspended:
            raise InvariantError(f"resume of a {self.state} destination window")
        self.window = self.resume_to
        if self.limit > 0 and self.window > self.limit:  # a reload lowered the limit meanwhile
            self.window = self.limit
        self.resume_to = READY_MIN

    def settle(self, observed: int) -> None:
        """READY: a session was refused while ``observed`` others were working (learned limit).

        The window becomes ``max(1, min(window, observed))`` and both accumulators restart; the
        dead-destination count is untouched (module doc, "Learned limits").
        """
        if not self.ready:
            raise InvariantError(f"settle of a {self.state} destination window")
        if observed < 0:
            raise InvariantError(f"settle with observed={observed}")
        self.window = max(READY_MIN, min(self.window, observed))
        self.success = self.failure = 0.0

    def revive(self) -> None:
        """THROTTLED -> READY at ``init`` with fresh accumulators (timer fired, or flush)."""
        if not self.throttled:
            raise InvariantError(f"revive of a {self.state} destination window")
        self.window = self.init
        self.success = self.failure = self.fail_cohorts = 0.0

    def update_limits(
        self,
        init: int,
        limit: int,
        positive: Feedback,
        negative: Feedback,
        cohort_limit: int,
    ) -> None:
        """Apply reloaded settings to a live window.

        The state is kept; a READY window above a new non-zero ``limit`` is clamped to it. A
        THROTTLED window stays dead (its timer still runs) and later revives at the new ``init``.
        """
        _check_settings(init, limit, cohort_limit)
        self.init = init
        self.limit = limit
        self.positive = positive
        self.negative = negative
        self.cohort_limit = cohort_limit
        if self.ready and limit > 0 and self.window > limit:
            self.window = limit


def _check_settings(init: int, limit: int, cohort_limit: int) -> None:
    """Raise InvariantError for settings the configuration layer should have clamped."""
    if init < READY_MIN:
        raise InvariantError(f"initial destination concurrency {init} < 1")
    if limit < 0:
        raise InvariantError(f"destination concurrency limit {limit} < 0")
    if limit > 0 and init > limit:
        raise InvariantError(f"initial destination concurrency {init} > limit {limit}")
    if cohort_limit < 0:
        raise InvariantError(f"failed cohort limit {cohort_limit} < 0")
