"""The state of one SMTP delivery attempt and how it becomes a ``DeliveryResult``.

``Attempt`` holds the recipients still pending, the results decided so far and
the last failure of each pending recipient. Its verbs carry Postfix's error
policy (smtp_trouble.c):

- ``fail(idx, failure)``: a hard error (5xx, unless ``soft_bounce``) bounces the
  recipient now; a soft one keeps it pending for the next server, remembering
  the failure;
- ``fail_pending(failure)``: the same for every pending recipient;
- ``sent(indexes, response, relay)``: the recipients are done (one reply for them all);
- ``finish()``: defers what is left with its last failure and sets the hop
  status (a destination failure, negative feedback) when a recipient ends
  deferred by a site-level failure and no session of this attempt completed a
  transaction (notes §10.4); when that failure was a refusal of the session
  ("full" or "rate", ``Failure.throttle``) and no recipient got any other
  outcome, the result also says ``throttle``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from qmgrd.delivery.agent import (
    DeliveryRequest,
    DeliveryResult,
    HopStatus,
    Outcome,
    Recipient,
    RecipientResult,
)
from qmgrd.delivery.client import Reply
from qmgrd.delivery.replies import Failure, reply_dsn, reply_text

_UNAVAILABLE = Failure("4.3.0", "server unavailable or unable to receive mail", site=True)


@dataclass(slots=True, eq=False)
class Attempt:
    """The mutable state of one ``deliver`` call."""

    request: DeliveryRequest
    soft_bounce: bool
    pending: dict[int, Recipient] = field(default_factory=dict)
    results: dict[int, RecipientResult] = field(default_factory=dict)
    last: dict[int, Failure] = field(default_factory=dict)
    completed: bool = False  # some session completed a transaction
    setup_time: float = 0.0
    xfer_time: float = 0.0

    @classmethod
    def start(cls, request: DeliveryRequest, *, soft_bounce: bool) -> Attempt:
        """A new attempt with every recipient of ``request`` pending."""
        return cls(request, soft_bounce, dict(enumerate(request.recipients)))

    def fail(self, idx: int, failure: Failure, *, final: bool = True) -> None:
        """Bounce now on a hard error; on a soft one keep the recipient for the next server.

        ``final=False`` (a failure at a destination that is not the last one, e.g.
        before ``smtp_fallback_relay``) never bounces.
        """
        if final and failure.dsn.startswith("5") and not self.soft_bounce:
            rcpt = self.pending.pop(idx)
            self.results[idx] = RecipientResult(
                rcpt, Outcome.BOUNCED, failure.dsn, failure.reply, failure.relay
            )
            self.last.pop(idx, None)
        else:
            self.last[idx] = failure

    def fail_pending(self, failure: Failure, *, final: bool = True) -> None:
        """Apply one failure to every pending recipient (site-level or message-level)."""
        for idx in list(self.pending):
            self.fail(idx, failure, final=final)

    def sent(self, indexes: Iterable[int], response: Reply, relay: str) -> None:
        """Record delivered recipients: one end-of-data reply for all of them (its DSN code
        and text are worked out once)."""
        dsn = reply_dsn(response.code, response.message)
        text = reply_text(response)
        pending, results, last = self.pending, self.results, self.last
        for idx in indexes:
            results[idx] = RecipientResult(pending.pop(idx), Outcome.SENT, dsn, text, relay)
            last.pop(idx, None)

    def finish(self) -> DeliveryResult:
        """Defer what is left and build the result, with a hop status if one is due."""
        hop: HopStatus | None = None
        throttle = None
        untouched = not self.results  # nothing was sent or bounced in this attempt
        for idx, rcpt in list(self.pending.items()):
            failure = self.last.get(idx) or _UNAVAILABLE
            dsn = "4" + failure.dsn[1:] if failure.dsn.startswith("5") else failure.dsn
            self.results[idx] = RecipientResult(
                rcpt, Outcome.DEFERRED, dsn, failure.reply, failure.relay
            )
            if failure.site and not self.completed and hop is None:
                hop = HopStatus(dsn, failure.reply)
                throttle = failure.throttle
            elif failure.throttle is None:
                untouched = False  # some recipient failed for another reason
        self.pending.clear()
        if not untouched:
            throttle = None
        ordered = tuple(self.results[idx] for idx in range(len(self.request.recipients)))
        return DeliveryResult(
            recipients=ordered,
            hop=hop,
            throttle=throttle if hop is not None else None,
            conn_setup_time=self.setup_time,
            transmission_time=self.xfer_time,
        )
