"""Terminal-safe text: the escaping table, and JSON that stays exact but safe."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.textsafe import printable, printable_json


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("user@example.com", "user@example.com"),
        ('"a\\b"@example.com', '"a\\b"@example.com'),  # a quoted backslash reads as stored
        ("josé@exämple.de 日本", "josé@exämple.de 日本"),
        ("a\x1b]0;pwned\x07b", "a\\x1b]0;pwned\\x07b"),
        ("nul\x00 del\x7f", "nul\\x00 del\\x7f"),
        ("tab\tlf\ncr\r", "tab\\tlf\\ncr\\r"),
        ("csi\x9b31m", "csi\\u009b31m"),  # C1 control as a code point
        (b"bad\xff\x9b".decode("utf-8", "surrogateescape"), "bad\\xff\\x9b"),  # raw bytes
        ("evil\u202egpj.exe", "evil\\u202egpj.exe"),  # right-to-left override
        ("zero\u200bwidth\u2028sep\u00a0nbsp", "zero\\u200bwidth\\u2028sep\\u00a0nbsp"),
        ("tag\U000e0001", "tag\\U000e0001"),
    ],
)
def test_printable_escapes_exactly_the_non_printable(raw: str, shown: str) -> None:
    """Each kind of dangerous character gets its documented escape; printable text is kept."""
    assert printable(raw) == shown


@given(st.text(alphabet=st.characters(codec=None)))
def test_printable_output_is_always_printable(text: str) -> None:
    """Whatever the input (controls, surrogates, any plane), the result has no unsafe character."""
    out = printable(text)
    assert out.isprintable()
    assert all(ch not in out for ch in "\x1b\x7f\x9b\n\r")


_json_values: st.SearchStrategy[Any] = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet=st.characters(codec=None)),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(alphabet=st.characters(codec=None), max_size=5), inner, max_size=4),
    max_leaves=10,
)


@given(_json_values)
def test_printable_json_decodes_to_the_same_value_and_is_safe(value: Any) -> None:
    """The JSON line is printable and json.loads gives back exactly the original value."""
    out = printable_json(value)
    assert out.isprintable()
    assert json.loads(out) == json.loads(json.dumps(value))


def test_printable_json_escapes_what_json_dumps_leaves_raw() -> None:
    """DEL, C1, bidi overrides and invalid UTF-8 become \\u escapes; ordinary text stays."""
    sender = b"a\x7fb\xc2\x9bc\xe2\x80\xaed\xff".decode("utf-8", "surrogateescape")
    out = printable_json({"sender": sender, "name": "José"})
    assert out == '{"sender": "a\\u007fb\\u009bc\\u202ed\\udcff", "name": "José"}'
    assert json.loads(out)["sender"] == sender
