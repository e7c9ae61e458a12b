"""parse_ip is ipaddress.ip_address: the same address or the same ValueError."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from qmgrd.netaddr import parse_ip

EDGES = [
    "127.0.0.1", "10.1.2.3", "0.0.0.0", "255.255.255.255", "::1", "::ffff:1.2.3.4",
    "fe80::1%eth0", "01.2.3.4", "1.2.3", "1.2.3.4.5", "256.1.1.1", " 1.2.3.4", "1.2.3.4 ",
    "1.2.3.4\x00", "\u0663.1.1.1", "1..2.3", "", "0x7f.0.0.1", "127.1",
]


def _outcome(fn: Callable[[str], object], text: str) -> str:
    try:
        return repr(fn(text))
    except ValueError:
        return "ValueError"


@pytest.mark.parametrize("text", EDGES)
def test_parse_ip_matches_ipaddress_on_edges(text: str) -> None:
    assert _outcome(parse_ip, text) == _outcome(ipaddress.ip_address, text)


_octet = st.one_of(st.integers(0, 300).map(str), st.text("0123456789x ", max_size=4))


@given(st.lists(_octet, min_size=1, max_size=6).map(".".join))
def test_parse_ip_matches_ipaddress_on_dotted_text(text: str) -> None:
    assert _outcome(parse_ip, text) == _outcome(ipaddress.ip_address, text)
