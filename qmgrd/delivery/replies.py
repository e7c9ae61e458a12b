"""Values shared by the SMTP client modules: failures, reply rendering, DSN parameters.

- ``Failure``: why a recipient is not delivered (yet): enhanced status code,
  text, relay, and whether it is *site-level* (may become a hop status, i.e. a
  destination failure: connect, greeting, EHLO, TLS, AUTH, lost connection).
- ``Lost``: the exception that carries a site-level ``Failure`` out of a
  session step (never crosses the agent boundary).
- ``reply_dsn`` / ``reply_text``: an SMTP reply as a DSN code and one line.
- ``xtext`` / ``dsn_param``: RFC 3461 xtext for ENVID and ORCPT.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from aiosmtplib import SMTPResponse

_ENHANCED = re.compile(r"^([245])\.(\d{1,3})\.(\d{1,3})(?=\s|$)")
_SAFE_XTEXT = re.compile(r"[!-*,-<>-~]")  # RFC 3461 xtext: printable except + and =
_XTEXT = re.compile(r"(?:[!-*,-<>-~]|\+[0-9A-F]{2})*")


def reply_dsn(code: int, message: str) -> str:
    """The enhanced status code of a reply: from its text when it agrees, else from the code."""
    match = _ENHANCED.match(message)
    klass = str(code)[0] if 200 <= code < 600 else "4"
    if match is not None and match.group(1) == klass:
        return f"{match.group(1)}.{match.group(2)}.{match.group(3)}"
    return f"{klass}.0.0"


def reply_text(response: SMTPResponse) -> str:
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


class Lost(Exception):
    """The session broke or the destination refused it: a site-level failure."""

    def __init__(self, failure: Failure) -> None:
        """Wrap ``failure`` (its text becomes the exception's)."""
        super().__init__(failure.reply)
        self.failure = failure
