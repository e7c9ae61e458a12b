"""The listener's decision table for cleanup outcomes."""

from __future__ import annotations

import pytest

from qmgrd.cleanup.intake import Decision, decide
from qmgrd.cleanup.processor import Disposition, Outcome


@pytest.mark.parametrize(
    ("outcome", "decision"),
    [
        (Outcome(), Decision(True, False, None, None)),
        (Outcome(Disposition.HOLD), Decision(True, True, None, None)),
        (Outcome(redirect="trap@x.example"), Decision(True, False, None, ("trap@x.example",))),
        (Outcome(Disposition.DISCARD), Decision(False, False, None, None)),
        (
            Outcome(Disposition.REJECT, reply="550 5.7.1 no"),
            Decision(False, False, "550 5.7.1 no", None),
        ),
        (
            Outcome(Disposition.TOO_MANY_HOPS),
            Decision(False, False, "554 5.4.0 Error: too many hops", None),
        ),
    ],
)
def test_decide(outcome: Outcome, decision: Decision) -> None:
    """Each disposition maps to Postfix's smtpd behaviour."""
    assert decide(outcome) == decision
