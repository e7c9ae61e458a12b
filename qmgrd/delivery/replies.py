"""Values shared by the SMTP client modules: failures, reply rendering, DSN parameters.

- ``Failure``: why a recipient is not delivered (yet): enhanced status code,
  text, relay, and whether it is *site-level* (may become a hop status, i.e. a
  destination failure: connect, greeting, EHLO, TLS, AUTH, lost connection).
- ``Lost``: the exception that carries a site-level ``Failure`` out of a
  session step (never crosses the agent boundary).
- ``reply_dsn`` / ``reply_text``: an SMTP reply as a DSN code and one line.
- ``xtext`` / ``dsn_param``: RFC 3461 xtext for ENVID and ORCPT.
- ``throttle_kind``: whether a server's refusal of a session reads as "full" (a concurrency
  limit: 421, "too many connections") or "rate" (a request to slow down: rate-limit texts),
  for learned destination limits (``DeliveryResult.throttle``).

Throttling texts recognised (collected from the large providers' published replies and from
bounces seen in the wild; matched case-insensitively on the first 1,000 characters):

- full: "too many (concurrent|simultaneous) (SMTP) connections/sessions" (generic MTAs,
  Postfix's anvil "too many connections from"), "connection limit", "maximum number of
  (concurrent) connections" (Exchange Online), "reached its limit for processing requests";
  and any other ``421`` at connection time (RFC 5321 §3.8: the service is closing the channel).
- rate: "rate limit(ed)", "rate controlled", "unusual rate" and ``4.7.28`` (Gmail's rate
  limiting), "temporarily deferred" and Yahoo's ``[TSnn]`` / ``[TSSnn]`` codes, Outlook.com's
  ``RP-00n`` and "limits for how many messages", "too many messages", "server busy",
  "try (again) later" (Gmail's ``421 4.7.0 Try again later``), "throttl", "slow down".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from qmgrd.delivery.agent import Throttle
from qmgrd.delivery.client import Reply

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?=\s|$)")
_THROTTLE_TEXT_LIMIT = 1000  # untrusted text: bound the regex work
_FULL = re.compile(
    r"too many (?:concurrent |simultaneous |open )?(?:smtp )?(?:connections|sessions)"
    r"|connection (?:count )?limit"
    r"|maximum number of (?:concurrent )?(?:server )?(?:connections|sessions)"
    r"|reached its limit for processing requests",
    re.IGNORECASE,
)
_RATE = re.compile(
    r"rate[ -]?limit|rate controlled|unusual rate|\b4\.7\.28\b|temporarily deferred"
    r"|\[TSS?\d\d\]|\bRP-00\d\b|limits? for how many messages|too many (?:messages|mails)"
    r"|server (?:is )?busy|try (?:again )?later|throttl|slow down",
    re.IGNORECASE,
)
_SAFE_XTEXT = re.compile(r"[!-*,-<>-~]")  # RFC 3461 xtext: printable except + and =
_XTEXT = re.compile(r"(?:[!-*,-<>-~]|\+[0-9A-F]{2})*")


def reply_dsn(code: int, message: str) -> str:
    """The enhanced status code of a reply: from its text when it agrees, else from the code."""
    match = _ENHANCED.match(message)
    klass = str(code)[0] if 200 <= code < 600 else "4"
    if match is not None and match.group(1) == klass:
        return f"{match.group(1)}.{match.group(2)}.{match.group(3)}"
    return f"{klass}.0.0"


def throttle_kind(code: int, text: str) -> Throttle | None:
    """How a 4xx refusal of a session reads (module doc): "full", "rate" or None (a failure).

    Only transient replies qualify: a 5xx refusal is never throttling.
    """
    if not 400 <= code < 500:
        return None
    head = text[:_THROTTLE_TEXT_LIMIT]
    if _FULL.search(head):
        return "full"
    if _RATE.search(head):
        return "rate"
    return "full" if code == 421 else None


def reply_text(response: Reply) -> str:
    """One-line rendering of a (possibly multi-line) reply: ``"550 5.1.1 user unknown"``."""
    return f"{response.code} {' '.join(response.message.splitlines())}".strip()


def xtext(value: str) -> str:
    """Encode a DSN parameter value as RFC 3461 xtext."""
    return "".join(ch if _SAFE_XTEXT.fullmatch(ch) else f"+{ord(ch):02X}" for ch in value)


def dsn_param(value: str) -> str:
    """A DSN parameter value for the wire: kept as is when it already is xtext.

    The listener stores ENVID and ORCPT exactly as the client sent them (validated
    xtext), so encoding them again would turn "+2B" into "+2B2B".
    """
    return value if _XTEXT.fullmatch(value) else xtext(value)


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a recipient is not delivered (yet)."""

    dsn: str
    reply: str
    relay: str = "none"
    site: bool = False  # site-level (THROTTLE class): may produce a hop status
    throttle: Throttle | None = None  # the session was refused as "full" or "rate" (site only)


class Lost(Exception):
    """The session broke or the destination refused it: a site-level failure."""

    def __init__(self, failure: Failure) -> None:
        """Wrap ``failure`` (its text becomes the exception's)."""
        super().__init__(failure.reply)
        self.failure = failure
