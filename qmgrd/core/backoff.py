"""Retry timing, expiry and delay warnings for deferred messages (DESIGN §7, notes §9).

Contract: pure functions of their arguments (times in seconds since the epoch, durations in
seconds). The engine calls them when a delivery pass of a message ends with deferred recipients:

- ``is_expired`` first: an expired message is returned to its sender instead of retried.
- ``delay_warning_due`` next: whether to send the one-time "delayed mail" notice.
- ``next_attempt`` last: the time the message becomes due again (Postfix stores it in the queue
  file's mtime).

Why age and not the previous delay: the delay equals the message's current age clamped to
[minimal_backoff_time, maximal_backoff_time], so each retry lands at about twice the age of the one
before (exponential back-off) without storing any per-message retry state (notes §13.23).
"""

from __future__ import annotations

from qmgrd.errors import InvariantError

__all__ = ["delay_warning_due", "is_expired", "next_attempt"]


def next_attempt(
    now: float, create_time: float, minimal_backoff: float, maximal_backoff: float
) -> float:
    """Return when a deferred message should be tried again.

    ``now + clamp(now - create_time, minimal_backoff, maximal_backoff)``; the clamp applies the
    maximum first and the minimum last, as Postfix does, so a minimum above the maximum wins. An
    unknown creation time (``create_time <= 0``) gives the minimum.
    """
    if minimal_backoff < 0 or maximal_backoff < 0:
        raise InvariantError(
            f"negative backoff time (minimal {minimal_backoff}, maximal {maximal_backoff})"
        )
    delay = now - create_time if create_time > 0 else minimal_backoff
    delay = min(delay, maximal_backoff)
    delay = max(delay, minimal_backoff)
    return now + delay


def is_expired(
    now: float,
    create_time: float,
    *,
    null_sender: bool,
    maximal_queue_lifetime: float,
    bounce_queue_lifetime: float,
) -> bool:
    """True when a message that still has deferred recipients must be returned to its sender.

    The lifetime is ``bounce_queue_lifetime`` for null-sender mail (capped at
    ``maximal_queue_lifetime``, as Postfix does at startup) and ``maximal_queue_lifetime``
    otherwise. A lifetime of 0 means "try once": the first deferral expires the message.
    """
    if maximal_queue_lifetime < 0 or bounce_queue_lifetime < 0:
        raise InvariantError(
            f"negative queue lifetime (maximal {maximal_queue_lifetime}, "
            f"bounce {bounce_queue_lifetime})"
        )
    lifetime = (
        min(bounce_queue_lifetime, maximal_queue_lifetime)
        if null_sender
        else maximal_queue_lifetime
    )
    return now >= create_time + lifetime


def delay_warning_due(now: float, warn_time: float | None) -> bool:
    """True when the one-time delay notice is due.

    ``warn_time`` is the message's stored warning time (arrival + ``delay_warning_time``); None or a
    value <= 0 means "no warning" or "already warned". Postfix fires one second early
    (``now >= warn_time - 1``) so a deferred scan landing just before the mark still sends it.
    """
    if warn_time is None or warn_time <= 0:
        return False
    return now >= warn_time - 1
