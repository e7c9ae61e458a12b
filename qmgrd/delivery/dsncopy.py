"""The original message inside a notice, and the notice's MIME boundary (``dsn``'s helpers).

``attachment(content, limit, headers_only)`` copies the untrusted original line by
line, never parsing it: line ends made CRLF, NUL and bare CR replaced by ``?``,
lines over ``MAX_LINE`` octets broken with CRLF SP, the copy cut after the last
whole line within ``limit`` bytes (only a prefix of ``limit`` + 2 bytes is looked
at); headers only when asked, or when the message is empty or too large
(Postfix's rule). ``choose_boundary`` derives the boundary from a hash of every
part and checks that its delimiter occurs in none of them; ``cte`` names a
part's transfer encoding from its bytes (7bit or 8bit).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence

MAX_LINE = 998  # RFC 5322 §2.1.1, without the CRLF

_HEADER_LINE = re.compile(rb"[ \t]|[^\x00-\x20\x7f:]+[ \t]*:")  # Postfix's IS_HEADER


def _wire_lines(line: bytes) -> list[bytes]:
    """One original line made safe for 8bit transport: masked, and broken below 998 octets."""
    line = line.replace(b"\0", b"?").replace(b"\r", b"?")
    if len(line) <= MAX_LINE:
        return [line]
    out = [line[:MAX_LINE]]
    for start in range(MAX_LINE, len(line), MAX_LINE - 1):
        out.append(b" " + line[start : start + MAX_LINE - 1])
    return out


def attachment(content: bytes, limit: int, headers_only: bool) -> tuple[bytes, bool]:
    """The bytes to attach and whether they are the whole message (else headers only).

    Postfix's rule: headers only when RET=HDRS or the message is empty or larger
    than the limit; the copy stops at the first non-header line (headers only) and never
    exceeds ``limit`` bytes (whole lines only).
    """
    whole = not headers_only and 0 < len(content) <= limit  # Postfix: empty = headers
    prefix = content[: limit + 2]  # enough to see whether the line at the limit ends
    raw_lines = prefix.split(b"\n")
    if len(prefix) < len(content) or raw_lines[-1] == b"":
        raw_lines.pop()  # an unfinished line at the cut, or the empty rest after a last LF
    out: list[bytes] = []
    size = 0
    for raw in raw_lines:
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        if not whole and not _HEADER_LINE.match(raw):
            break
        pieces = _wire_lines(raw)
        need = sum(len(p) + 2 for p in pieces)
        if size + need > limit:
            if whole:  # normalising made it grow past the limit: fall back to headers
                return attachment(content, limit, headers_only=True)
            break
        out.extend(pieces)
        size += need
    return b"".join(p + b"\r\n" for p in out), whole


_BCHARS = re.compile(r"[^0-9A-Za-z'()+_,\-./:=?]")


def _sha(counter: int, parts: Sequence[bytes]) -> str:
    h = hashlib.sha256(counter.to_bytes(4, "big"))
    for part in parts:
        h.update(part)
    return h.hexdigest()[:24]


def choose_boundary(
    seed: str,
    parts: Sequence[bytes],
    digest: Callable[[int, Sequence[bytes]], str] = _sha,
) -> str:
    """A MIME boundary ``seed/<digest>`` whose delimiter occurs in none of ``parts``.

    The digest covers the parts, so content cannot embed the boundary that will
    be chosen for it; the check and retry make that certain rather than likely.
    """
    seed = _BCHARS.sub("", seed)[:40]
    candidate = seed
    for counter in range(64):
        candidate = f"{seed}/{digest(counter, parts)}"
        delimiter = b"--" + candidate.encode("ascii")
        if not any(delimiter in part for part in parts):
            return candidate
    return candidate  # unreachable for a cryptographic digest (64 collisions in a row)


def cte(data: bytes) -> str:
    return "7bit" if data.isascii() else "8bit"
