"""Postfix's lookup orders for address keys (transport(5), access(5), generic(5))."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.tables import (
    LookupTable,
    Order,
    address_keys,
    domain_keys,
    find_address,
    find_domain,
    open_table,
)

ROOT = Path("/")


def table(spec: str) -> LookupTable:
    return open_table(spec, base_dir=ROOT)


def test_transport_order_with_extension() -> None:
    """transport(5): user+ext@domain, user@domain, domain, .parents, *."""
    assert address_keys("User+Ext@Sub.Example.COM", Order.TRANSPORT, recipient_delimiter="+") == [
        "user+ext@sub.example.com",
        "user@sub.example.com",
        "sub.example.com",
        ".example.com",
        ".com",
        "*",
    ]


def test_access_order_with_extension() -> None:
    """access(5): user+foo@domain, user@domain, domain, (parents), user+foo@, user@."""
    assert address_keys("user+foo@domain", Order.ACCESS, recipient_delimiter="+") == [
        "user+foo@domain",
        "user@domain",
        "domain",
        "user+foo@",
        "user@",
    ]


def test_address_order_generic() -> None:
    """generic(5)/canonical(5): user@domain, then @domain."""
    assert address_keys("u-x@d.example", Order.ADDRESS, recipient_delimiter="+-") == [
        "u-x@d.example",
        "u@d.example",
        "@d.example",
    ]


def test_no_extension_without_delimiter_or_at_start() -> None:
    """Without recipient_delimiter there is no unextended key; a leading delimiter is no cut."""
    assert address_keys("u+x@d", Order.ADDRESS) == ["u+x@d", "@d"]
    assert address_keys("+x@d", Order.ADDRESS, recipient_delimiter="+") == ["+x@d", "@d"]


def test_parent_domain_matches_subdomains_style() -> None:
    """With parent_domain_matches_subdomains the parents are tried without the leading dot."""
    assert list(domain_keys("a.b.example", parent_matches_subdomains=True)) == [
        "a.b.example",
        "b.example",
        "example",
    ]
    assert list(domain_keys("[192.0.2.1]")) == ["[192.0.2.1]"]  # a literal has no parents


def test_key_precedence_across_tables() -> None:
    """Each key goes to every table before the next key (maps_find): a later table's exact
    address beats an earlier table's domain entry."""
    first = table("inline:{ example.com=domain-first }")
    second = table("inline:{ user@example.com=address-second }")
    assert find_address([first, second], "user@example.com", Order.TRANSPORT) == "address-second"


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("user@example.com", "exact"),
        ("other@example.com", "domain"),
        ("x@sub.example.com", "subdomain"),
        ("x@example.com.evil", "wildcard"),
    ],
)
def test_transport_dot_domain_never_matches_the_domain_itself(address: str, expected: str) -> None:
    """.example.com matches subdomains only; example.com only itself (transport(5) default)."""
    t = table(
        "inline:{ user@example.com=exact, example.com=domain, .example.com=subdomain, *=wildcard }"
    )
    assert find_address([t], address, Order.TRANSPORT) == expected


def test_pattern_tables_only_see_the_full_address() -> None:
    """regexp tables are asked the full address only, never user@ or domain keys."""
    rx = table("regexp:{ {/^example\\.com$/ domain-key-leaked} }")
    assert find_address([rx], "u@example.com", Order.TRANSPORT) is None
    rx2 = table("regexp:{ {/^U@Example/i case-sensitive} }")
    assert find_address([rx2], "U@Example.com", Order.TRANSPORT) == "case-sensitive"


def test_find_domain_parents() -> None:
    """find_domain tries the name, then .parents (or parents with the flag)."""
    t = table("inline:{ .example.com=dot, example.org=bare }")
    assert find_domain([t], "mx.example.com") == "dot"
    assert find_domain([t], "example.com") is None
    assert find_domain([t], "mx.example.org") is None
    assert find_domain([t], "mx.example.org", parent_matches_subdomains=True) == "bare"
