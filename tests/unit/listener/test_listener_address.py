"""parse_path's syntax rules, on both sides of its one-pass checks for plain addresses."""

from __future__ import annotations

import pytest

from qmgrd.listener.address import AddressError, parse_path


@pytest.mark.parametrize(
    ("arg", "address", "params", "non_ascii"),
    [
        ("<a@src.test>", "a@src.test", (), False),
        ("  <a.b+c@x-y.src.test.> SIZE=1 X=2", "a.b+c@x-y.src.test.", ("SIZE=1", "X=2"), False),
        ("a@src.test SIZE=1", "a@src.test", ("SIZE=1",), False),  # brackets omitted
        ("<@r1,@r2:u@src.test>", "u@src.test", (), False),  # source route dropped
        ('<"x y>z"@src.test>', '"x y>z"@src.test', (), False),  # ">" inside quotes
        ('<"a\\"b"@src.test>', '"a\\"b"@src.test', (), False),  # an escaped quote
        ("<\u00e9t\u00e9@\u00e9x.test>", "\u00e9t\u00e9@\u00e9x.test", (), True),
        ("<a@[192.0.2.1]>", "a@[192.0.2.1]", (), False),
        ("<>", "", (), False),
    ],
)
def test_valid_paths(arg: str, address: str, params: tuple[str, ...], non_ascii: bool) -> None:
    """Plain, quoted, routed, literal and non-ASCII paths parse to the address as sent."""
    path = parse_path(arg)
    assert (path.address, path.params, path.non_ascii) == (address, params, non_ascii)


@pytest.mark.parametrize(
    "arg",
    [
        "<a@src.test",  # no closing bracket
        '<"a>@src.test',  # the only ">" is quoted
        "<a\\>@src.test>",  # a backslash outside quotes escapes nothing: text after ">"
        "<a@src.test>x",
        "<a(b@src.test>",  # ASCII outside atext
        "<a b@src.test>",
        "<.a@src.test>",
        "<a.@src.test>",
        "<a\u200b@src.test>",  # not printable
        "<a@src_test.org>",
        "<a@-src.test>",
        "<a@src..test>",
        "<a@src.te\u00a0st>",  # not alphanumeric
        "<a@>",
        "<@src.test>",
    ],
)
def test_invalid_paths(arg: str) -> None:
    """Each rule refuses what it should, whether the address is plain or not."""
    with pytest.raises(AddressError):
        parse_path(arg)
