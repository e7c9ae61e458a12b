"""Message header syntax as Postfix's cleanup sees it (is_header.c, header_opts.c).

Contract
--------
- `header_name_length(line)`: the length of the field name when ``line``
  starts a header (``name:``, or ``name  :`` with blanks before the colon, as
  Postfix's ``is_header_buf``), else 0. A name is one or more bytes from 33 to
  126 except ``:``: a name with 8-bit bytes, control characters or blanks
  inside is no header, so such a line ends the header section (it becomes the
  first body line), exactly as in Postfix.
- `HeaderClass` and `classify(name)`: which headers carry sender or recipient
  addresses (rewritten), which count as hops (``Received``, ``Delivered-To``).
"""

from __future__ import annotations

import enum
import re

# A field name (bytes 33-126 but ':'), then optional blanks, then ':' (is_header_buf).
_HEADER_NAME = re.compile(rb"[!-9;-~]+(?=[ \t]*:)")


def header_name_length(line: bytes) -> int:
    """The field name's length if ``line`` starts a header, else 0 (Postfix's is_header)."""
    found = _HEADER_NAME.match(line)
    return found.end() if found is not None else 0


class HeaderClass(enum.Enum):
    """What cleanup does with a header beyond header_checks."""

    OTHER = "other"
    SENDER = "sender"  # addresses rewritten in the header_sender class
    RECIPIENT = "recipient"  # addresses rewritten in the header_recipient class
    HOP = "hop"  # counted against hopcount_limit


SENDER_HEADERS = frozenset(
    {
        "from",
        "sender",
        "reply-to",
        "errors-to",
        "return-receipt-to",
        "resent-from",
        "resent-sender",
        "resent-reply-to",
        "disposition-notification-to",
    }
)
RECIPIENT_HEADERS = frozenset(
    {"to", "cc", "bcc", "apparently-to", "resent-to", "resent-cc", "resent-bcc"}
)
HOP_HEADERS = frozenset({"received", "delivered-to"})


def classify(name: str) -> HeaderClass:
    """The class of a header by its lower-cased name."""
    return CLASSES.get(name, HeaderClass.OTHER)


# classify's answers but OTHER, by name: ``CLASSES.get(name, OTHER)`` is classify in one lookup.
CLASSES: dict[str, HeaderClass] = {
    **{name: HeaderClass.HOP for name in HOP_HEADERS},
    **{name: HeaderClass.RECIPIENT for name in RECIPIENT_HEADERS},
    **{name: HeaderClass.SENDER for name in SENDER_HEADERS},
}


def line_ending(line: bytes) -> bytes:
    """The line's ending (CR LF, LF, or empty for a last line without one)."""
    if line.endswith(b"\r\n"):
        return b"\r\n"
    if line.endswith(b"\n"):
        return b"\n"
    return b""
