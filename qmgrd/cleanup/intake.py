"""What the SMTP listener does with a cleanup `Outcome` at the end of DATA.

`decide(outcome)` turns the processor's outcome into a `Decision` for an SMTP
session, following Postfix's smtpd + cleanup:

- ACCEPT: store the queue file; reply ``250 2.0.0 Ok: queued as ID``;
- REDIRECT (with ACCEPT or HOLD): the only recipient becomes the REDIRECT
  address (the original recipients are dropped, as in Postfix);
- HOLD: store the queue file straight into ``hold/`` (never visible in
  ``incoming/``); the same 250 reply;
- DISCARD: store nothing, still reply 250 (Postfix: "queued as" and a
  ``discard:`` log line), so the client does not retry;
- REJECT: store nothing, reply the header_checks text (``550 5.7.1 ...``);
- TOO_MANY_HOPS: store nothing, ``554 5.4.0 Error: too many hops`` (Postfix's
  smtpd reply; the previous hop bounces the message to its sender).

The listener must read DATA to its end in every case (the reply comes after
the final dot) and may stop writing the temporary queue file as soon as
``processor.outcome.disposition`` is REJECT (it cannot change afterwards).
"""

from __future__ import annotations

from dataclasses import dataclass

from qmgrd.cleanup.processor import Disposition, Outcome

_ACCEPT = Disposition.ACCEPT


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do with the message after DATA."""

    store: bool  # commit the queue file
    hold: bool  # commit it into hold/, not incoming/
    reply: str | None  # an error reply instead of "250 2.0.0 Ok: queued as ID"
    recipients: tuple[str, ...] | None  # REDIRECT: the recipients that replace all others


_STORE = Decision(True, False, None, None)  # the common case, built once (it is frozen)


def decide(outcome: Outcome) -> Decision:
    """The listener's course of action for this outcome (module doc)."""
    d = outcome.disposition
    if d is _ACCEPT and not outcome.redirect:
        return _STORE
    redirect = (outcome.redirect,) if outcome.redirect else None
    if d is Disposition.REJECT:
        return Decision(False, False, outcome.reply, None)
    if d is Disposition.TOO_MANY_HOPS:
        return Decision(False, False, outcome.reply or "554 5.4.0 Error: too many hops", None)
    if d is Disposition.DISCARD:
        return Decision(False, False, None, None)
    return Decision(True, d is Disposition.HOLD, None, redirect)
