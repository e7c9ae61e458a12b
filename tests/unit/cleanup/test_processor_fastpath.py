"""The header pass's shortcuts give exactly what the full path gives."""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.cleanup import AddressRewriter, rewrite_header_value
from qmgrd.cleanup.addresses import Role
from qmgrd.cleanup.processor import _QUALIFIED
from qmgrd.tables import open_table
from tests.unit.cleanup.test_processor import ROOT, make_settings, run

REWRITER = AddressRewriter(myorigin="host.example", mydomain="example")
# Bytes that matter to address syntax, letters, blanks, line endings and one 8-bit byte.
_SYNTAX = ["a", "b.c", "@", "<", ">", " ", "\t", '"', "(", ")", ",", ";", ":", "\\", "[", "]"]
_PIECES = st.sampled_from([*_SYNTAX, "\r\n", "\n", "\r\n ", "x y", "\xe9"])


@settings(max_examples=2000, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join))
def test_a_value_the_shortcut_takes_is_one_the_full_rewrite_keeps(value: str) -> None:
    """Whatever ``_QUALIFIED`` matches, rewriting that only qualifies leaves byte for byte."""
    raw = value.encode("utf-8", "surrogateescape")
    if _QUALIFIED.match(raw):
        for role in (Role.HEADER_SENDER, Role.HEADER_RECIPIENT):
            assert rewrite_header_value(value, functools.partial(_rewrite, role=role)) == value


def _rewrite(address: str, *, role: Role) -> str:
    return REWRITER.rewrite(address, role)


def test_the_shortcut_takes_the_common_shapes_only() -> None:
    """One address with a domain, bare or after a plain phrase; anything else goes the long way."""
    taken = [b" <a@b.c>\r\n", b" a@b.c\n", b" Joe Bloggs <a@b>\r\n", b"<a@b>"]
    not_taken = [
        b" root\r\n",
        b" <root>\r\n",
        b" a@b, c@d\r\n",
        b' "J" <a@b>\r\n',
        b" (c) a@b\r\n",
        b" <a@b>\r\n\tx\r\n",
        b" g: a@b;\r\n",
        b" <@r:a@b>\r\n",
        b" \xc3\xa9@b\r\n",
    ]
    assert [bool(_QUALIFIED.match(v)) for v in taken] == [True] * len(taken)
    assert [bool(_QUALIFIED.match(v)) for v in not_taken] == [False] * len(not_taken)


def test_canonical_maps_still_rewrite_a_qualified_header_address() -> None:
    """With canonical_maps the shortcut is off: From: <a@b.example> is mapped."""
    rewriter = AddressRewriter(
        myorigin="host.example",
        mydomain="example",
        canonical_maps=(open_table("inline:{ a@b.example=new@c.example }", base_dir=ROOT),),
    )
    s = dataclasses.replace(make_settings(), rewriter=rewriter)
    out, _ = run(b"From: A <a@b.example>\r\nTo: a@b.example\r\n\r\nbody\r\n", s)
    assert b"From: A <new@c.example>\r\n" in out and b"To: new@c.example\r\n" in out


def test_a_bare_local_part_is_still_qualified() -> None:
    """The shortcut never hides qualification: To: root gets @myorigin."""
    out, _ = run(b"To: root\r\nCc: <root>\r\nFrom: a@b.c\r\n\r\nbody\r\n")
    assert b"To: root@host.example\r\n" in out and b"Cc: <root@host.example>\r\n" in out
    assert b"From: a@b.c\r\n" in out
