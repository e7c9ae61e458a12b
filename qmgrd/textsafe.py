"""Terminal-safe text: what the CLI may print of addresses, replies and other foreign strings.

Addresses, remote replies and header-derived text come from outside. Printed
raw, an ESC or a C1 control byte lets a sender move the operator's cursor,
rewrite lines of ``mailq`` output, set the terminal title or worse; a
right-to-left override makes an address read differently from what it is.
Every CLI output of such text goes through one of these two functions
(issue 9, item 2). Postfix's showq replaces such characters by ``?``; we
escape them instead, so the operator can still tell the bytes apart.

``printable(text) -> str`` (text output), escaping, one character at a time:

==============================================  ===========================
character                                       shown as
==============================================  ===========================
printable (``str.isprintable``: letters of any  itself (``\\`` included, so
script, digits, punctuation, ASCII space)       ``"a\\b"@x`` reads as stored)
tab, line feed, carriage return                 ``\\t`` ``\\n`` ``\\r``
other ASCII controls (0x00-0x1f) and DEL        ``\\x1b``, ``\\x7f``
a byte of invalid UTF-8 (kept by the spool as   ``\\xff`` (the byte itself)
a ``surrogateescape`` lone surrogate)
any other non-printable code point: C1          ``\\u009b``, ``\\u202e``,
controls, format characters (bidi overrides,    ``\\U000e0001``
zero-width), non-ASCII spaces, line/paragraph
separators, unassigned, private use
==============================================  ===========================

So ``\\xHH`` is always a single byte (an ASCII control or a byte that is not
UTF-8) and ``\\uHHHH`` a Unicode code point. The backslash itself is not
escaped: the output is for eyes, not for parsing (use ``--json``).

``printable_json(obj) -> str``: ``json.dumps(obj, ensure_ascii=False)`` with
every character that ``printable`` would escape written as a JSON ``\\uHHHH``
escape (a surrogate pair above U+FFFF). JSON already escapes ASCII controls;
this adds DEL, C1, format characters and invalid UTF-8 (``\\udcff``), so the
line is safe on a terminal and decodes (``json.loads``) to exactly the same
value as plain ``json.dumps`` would.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["printable", "printable_json"]

_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    code = ord(ch)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    if code < 0x20 or code == 0x7F:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original byte was not UTF-8
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped (table in the module doc)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _json_escape(ch: str) -> str:
    code = ord(ch)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable_json(obj: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False)``, made safe on a terminal (see the module doc).

    Non-printable characters can only occur inside JSON strings (the syntax
    outside them is ASCII), where a ``\\u`` escape means the same character.
    """
    text = json.dumps(obj, ensure_ascii=False)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _json_escape(ch) for ch in text)
