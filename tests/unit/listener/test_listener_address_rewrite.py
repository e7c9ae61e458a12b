"""parse_path with cleanup's rewriting: qualified before the check, the given address kept."""

from __future__ import annotations

import pytest

from qmgrd.listener.address import AddressError, parse_path


def _qualify(address: str) -> str:
    return address if "@" in address else f"{address}@origin.test"


def test_bare_local_part_is_qualified_before_the_syntax_check() -> None:
    """<root> becomes root@origin.test instead of a syntax error; the given form is kept."""
    path = parse_path("<root> SIZE=10", rewrite=_qualify)
    assert (path.address, path.given, path.params) == ("root@origin.test", "root", ("SIZE=10",))
    with pytest.raises(AddressError):
        parse_path("<root>")


def test_rewritten_address_must_still_be_valid() -> None:
    """A rewrite that yields a bad address, or undecodable input, is still a syntax error."""
    with pytest.raises(AddressError):
        parse_path("<a@b>", rewrite=lambda _a: "no domain@")
    with pytest.raises(AddressError):
        parse_path("<r\udcff@x.test>", rewrite=_qualify)
