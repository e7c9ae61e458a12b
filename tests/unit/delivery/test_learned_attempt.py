"""``Attempt.finish`` sets ``throttle`` only for a refused session that decided every recipient,
and ``throttle_kind`` reads refusal texts (bounded, 4xx only)."""

from __future__ import annotations

import pytest

from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, HopStatus, Recipient, Throttle
from qmgrd.delivery.attempt import Attempt
from qmgrd.delivery.content import BytesContent
from qmgrd.delivery.replies import Failure, throttle_kind
from qmgrd.errors import InvariantError

FULL = Failure("4.7.0", "host h refused to talk to me: 421 4.7.0 busy", "h", True, "full")
HARD = Failure("5.1.1", "550 5.1.1 user unknown", "h")


def _attempt(n: int) -> Attempt:
    request = DeliveryRequest(
        queue_id="Q",
        transport="smtp",
        nexthop="[h]",
        sender="s@x",
        recipients=tuple(Recipient(f"r{i}@x", offset=i) for i in range(n)),
        content=BytesContent(b"x\r\n"),
    )
    return Attempt.start(request, soft_bounce=False)


def test_refused_session_is_a_throttle_with_its_hop_status() -> None:
    """Every recipient deferred by the refusal: throttle "full" and the hop status as before."""
    att = _attempt(2)
    att.fail_pending(FULL)
    result = att.finish()
    assert result.throttle == "full"
    assert result.hop == HopStatus("4.7.0", FULL.reply)


def test_a_bounced_recipient_cancels_the_throttle() -> None:
    """A recipient already decided otherwise (bounced) means the entry cannot simply be put
    back: no throttle, the hop status stays."""
    att = _attempt(2)
    att.fail(0, HARD)
    att.fail_pending(FULL)
    result = att.finish()
    assert result.throttle is None
    assert result.hop is not None


def test_throttle_without_hop_is_a_bug() -> None:
    """An agent that reports a throttle without a hop status breaks the contract."""
    with pytest.raises(InvariantError, match="hop status"):
        DeliveryResult(recipients=(), throttle="full")


@pytest.mark.parametrize(
    ("code", "text", "kind"),
    [
        (421, "4.7.0 Try again later, closing connection.", "rate"),
        (421, "4.7.0 Too many concurrent SMTP connections from this IP; try again later", "full"),
        (421, "RP-001 Unfortunately, some messages weren't sent. We have limits", "rate"),
        (451, "4.7.500 Server busy. Please try again later", "rate"),
        (421, "4.3.2 The maximum number of concurrent server connections has exceeded", "full"),
        (421, "4.4.2 bye", "full"),
        (450, "4.3.2 please come back", None),
        (554, "5.7.1 too many connections", None),
        (421, "x" * 5000 + " rate limited", "full"),  # beyond the bounded prefix: plain 421
    ],
)
def test_throttle_kind(code: int, text: str, kind: Throttle | None) -> None:
    """Concurrency texts and plain 421 are "full", rate-limit texts "rate", 5xx never."""
    assert throttle_kind(code, text) == kind
