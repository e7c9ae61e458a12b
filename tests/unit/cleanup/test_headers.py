"""``header_name_length``: Postfix's is_header_buf rule, checked against a plain byte loop."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from qmgrd.cleanup.headers import header_name_length

_BLANKS = b" \t"


def _reference(line: bytes) -> int:
    """is_header_buf as a byte loop: name bytes 33-126 but ':', blanks, then ':'."""
    n = 0
    while n < len(line):
        c = line[n]
        if c == 0x3A:
            return n
        if c in _BLANKS and n > 0:
            rest = n
            while rest < len(line) and line[rest] in _BLANKS:
                rest += 1
            return n if rest < len(line) and line[rest] == 0x3A else 0
        if c < 33 or c > 126:
            return 0
        n += 1
    return 0


def test_examples() -> None:
    """Names before a colon count, blanks before the colon are allowed, anything else is no
    header."""
    assert header_name_length(b"Subject: hi\r\n") == 7
    assert header_name_length(b"Subject  :hi") == 7
    assert header_name_length(b"Sub ject: hi") == 0
    assert header_name_length(b": empty name") == 0
    assert header_name_length(b" Subject: folded") == 0
    assert header_name_length(b"Caf\xc3\xa9: 8-bit") == 0
    assert header_name_length(b"no colon at all") == 0


@given(st.binary(max_size=12).map(lambda b: b.replace(b"\x01", b":")))
def test_matches_the_byte_loop(line: bytes) -> None:
    """The compiled pattern gives exactly the byte loop's answer for any bytes."""
    assert header_name_length(line) == _reference(line)


@given(st.lists(st.sampled_from([b"a", b"Z", b" ", b"\t", b":", b"\x80", b"~", b"\r\n"])))
def test_matches_on_header_like_lines(parts: list[bytes]) -> None:
    """Lines built from header-ish pieces agree too (colons and blanks are frequent)."""
    line = b"".join(parts)
    assert header_name_length(line) == _reference(line)
