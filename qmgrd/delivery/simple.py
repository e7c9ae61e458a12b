"""The ``discard``, ``error`` and ``retry`` agents (Postfix discard(8), error(8)).

They never touch the network. The nexthop text is the reason, optionally
starting with an enhanced status code: ``"5.1.1 user unknown"``.

- ``discard``: every recipient is sent, reply ``"discarded"`` (with the reason
  if one was given), dsn 2.0.0.
- ``error``: every recipient bounces with the code and reason (default 5.0.0);
  a 4.x.x code defers instead, as Postfix's error(8) does; ``soft_bounce``
  turns a bounce into a deferral with the class digit changed to 4.
- ``retry``: every recipient is deferred (default 4.0.0; a 5.x.x code is
  softened to 4.x.x, because retry means "try again later").

None of them sets a hop status: a configured refusal says nothing about a
destination's capacity.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qmgrd.delivery.agent import DeliveryRequest, DeliveryResult, Outcome, RecipientResult

_DSN_PREFIX = re.compile(r"^\s*([245])\.(\d{1,3})\.(\d{1,3})(?:\s+|$)")


def split_reason(text: str, default_dsn: str) -> tuple[str, str]:
    """Split ``"d.d.d reason"`` into (dsn, reason); use ``default_dsn`` when absent."""
    match = _DSN_PREFIX.match(text)
    if match is None:
        return default_dsn, text.strip() or "delivery temporarily suspended"
    dsn = f"{match.group(1)}.{match.group(2)}.{match.group(3)}"
    reason = text[match.end() :].strip()
    return dsn, reason or ("delivery temporarily suspended" if dsn[0] == "4" else "refused")


def soften(dsn: str) -> str:
    """Turn a permanent enhanced status code into its transient counterpart (5.x.y → 4.x.y)."""
    return "4" + dsn[1:] if dsn.startswith("5") else dsn


@dataclass(slots=True, eq=False)
class DiscardAgent:
    """Accept and drop every recipient."""

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Mark every recipient sent with reply "discarded"."""
        reason = request.nexthop.strip()
        reply = f"discarded: {reason}" if reason else "discarded"
        return DeliveryResult(
            recipients=tuple(
                RecipientResult(r, Outcome.SENT, "2.0.0", reply) for r in request.recipients
            )
        )

    async def close(self) -> None:
        """Nothing to release."""


@dataclass(slots=True, eq=False)
class ErrorAgent:
    """Bounce (or, for a 4.x.x code or with soft_bounce, defer) every recipient."""

    soft_bounce: bool = False

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Apply the nexthop's code and reason to every recipient."""
        dsn, reason = split_reason(request.nexthop, "5.0.0")
        outcome = Outcome.BOUNCED if dsn[0] == "5" else Outcome.DEFERRED
        if outcome is Outcome.BOUNCED and self.soft_bounce:
            outcome, dsn = Outcome.DEFERRED, soften(dsn)
        return DeliveryResult(
            recipients=tuple(RecipientResult(r, outcome, dsn, reason) for r in request.recipients)
        )

    async def close(self) -> None:
        """Nothing to release."""


@dataclass(slots=True, eq=False)
class RetryAgent:
    """Defer every recipient with the nexthop's reason."""

    async def deliver(self, request: DeliveryRequest) -> DeliveryResult:
        """Defer every recipient (a permanent code is softened)."""
        dsn, reason = split_reason(request.nexthop, "4.0.0")
        dsn = soften(dsn)
        return DeliveryResult(
            recipients=tuple(
                RecipientResult(r, Outcome.DEFERRED, dsn, reason) for r in request.recipients
            )
        )

    async def close(self) -> None:
        """Nothing to release."""
