"""Address resolution: transport_maps tables, lookup order, special transports, queue names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.core.resolve import (
    _LITERAL_RE,
    EMPTY,
    Resolved,
    Resolver,
    ResolverSettings,
    TransportTable,
    _domain_of,
    queue_name,
)
from qmgrd.tables import Order, find_address, open_table

# The transport table the tests route with (the table types themselves are tested in
# tests/unit/tables); the first table comes first in lookup order.
SECOND = (
    "inline:{ user@example.com=relay:[10.0.0.9]:2525, example.com=smtp:mx.example.net, "
    ".example.com=relay:, { Sub.Example.org = error:5.1.2 host not found }, "
    ".example.org=:[192.0.2.1], *=smtp:fallback.example }"
)

INLINE = "inline:{ a.example=discard:, {b.example = retry:4.4.1 try later}, user@example.com=x: }"


def make_table(*specs: str, parents: bool = False) -> TransportTable:
    """A core TransportTable over real lookup tables, searched as the daemon does."""
    tables = [open_table(spec, base_dir=Path("/")) for spec in specs]

    def find(address: str, delimiter: str) -> str | None:
        return find_address(
            tables,
            address,
            Order.TRANSPORT,
            recipient_delimiter=delimiter,
            parent_matches_subdomains=parents,
        )

    return TransportTable(find)


def table() -> TransportTable:
    """The inline table first, then the texthash one (lookup order)."""
    return make_table(INLINE, SECOND)


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("user@example.com", "x:"),  # full address, first table wins
        ("USER@Example.COM", "x:"),  # keys are case-insensitive
        ("other@example.com", "smtp:mx.example.net"),  # exact domain
        ("u@deep.sub.example.com", "relay:"),  # .parent matches any subdomain depth
        ("u@sub.example.org", "error:5.1.2 host not found"),  # exact beats .parent
        ("u@x.sub.example.org", ":[192.0.2.1]"),  # closest .parent
        ("u@example.org", "smtp:fallback.example"),  # .example.org is not example.org
        ("u@a.example", "discard:"),  # inline table
        ("u@elsewhere.test", "smtp:fallback.example"),  # wildcard last
    ],
)
def test_lookup_order(address: str, expected: str) -> None:
    """user@domain, then domain, then .parent domains, then *; first key found wins."""
    assert table().lookup(address) == expected


def test_key_precedence_beats_table_order() -> None:
    """A more specific key in a later table beats a wildcard in an earlier one."""
    t = make_table("inline:{ *=a: }", "inline:{ x.test=b: }")
    assert t.lookup("u@x.test") == "b:"
    assert t.lookup("u@y.test") == "a:"


def test_lookup_strips_address_extension() -> None:
    """With a recipient delimiter, user+ext@domain falls back to user@domain before domain."""
    t = make_table("inline:{ user@x.test=a:, x.test=b: }")
    assert t.lookup("user+tag@x.test", recipient_delimiter="+") == "a:"
    assert t.lookup("user+tag@x.test") == "b:"
    assert t.lookup("user-tag@x.test", recipient_delimiter="+-") == "a:"


def test_empty_table_matches_nothing() -> None:
    """EMPTY (no transport_maps) never matches."""
    assert EMPTY.lookup("u@x.test") is None


def resolver(**kwargs: Any) -> Resolver:
    """A resolver over the test tables with extra settings."""
    return Resolver(ResolverSettings(transport_table=table(), **kwargs))


@pytest.mark.parametrize(
    ("address", "transport", "nexthop"),
    [
        ("user@example.com", "x", "example.com"),  # empty nexthop: recipient domain
        ("other@example.com", "smtp", "mx.example.net"),
        ("u@deep.sub.example.com", "relay", "deep.sub.example.com"),  # empty nexthop
        ("u@x.sub.example.org", "smtp", "[192.0.2.1]"),  # empty transport: default
        ("u@sub.example.org", "error", "5.1.2 host not found"),
        ("u@b.example", "retry", "4.4.1 try later"),
        ("u@a.example", "discard", "a.example"),
        ("u@elsewhere.test", "smtp", "fallback.example"),
    ],
)
def test_resolve_with_tables(address: str, transport: str, nexthop: str) -> None:
    """Table values transport:nexthop with either part empty fill in from the default route."""
    assert resolver().resolve(address) == Resolved(transport, nexthop, address)


def test_resolve_default_route_without_tables() -> None:
    """No table: default_transport to the recipient domain (lowercased), address unchanged."""
    r = Resolver(ResolverSettings())
    assert r.resolve("Bob@Example.COM") == Resolved("smtp", "example.com", "Bob@Example.COM")
    assert r.resolve("u@[192.0.2.7]") == Resolved("smtp", "[192.0.2.7]", "u@[192.0.2.7]")
    assert r.resolve("u@example.com.") == Resolved("smtp", "example.com", "u@example.com.")


def test_relayhost_and_default_transport_nexthop() -> None:
    """relayhost replaces the domain for the default route; default_transport's own nexthop
    beats relayhost; an explicit table nexthop beats both."""
    r = Resolver(ResolverSettings(relayhost="[127.0.0.1]:2525"))
    assert r.resolve("u@x.test").nexthop == "[127.0.0.1]:2525"
    r = Resolver(ResolverSettings(default_transport="relay:[10.1.1.1]", relayhost="[127.0.0.1]"))
    assert r.resolve("u@x.test") == Resolved("relay", "[10.1.1.1]", "u@x.test")
    r = Resolver(
        ResolverSettings(
            relayhost="[127.0.0.1]:2525",
            transport_table=make_table("inline:{ x.test=smtp:[::1]:25 }"),
        )
    )
    assert r.resolve("u@x.test").nexthop == "[::1]:25"
    assert r.resolve("u@y.test").nexthop == "[127.0.0.1]:2525"
    with pytest.raises(ValueError, match="default_transport"):
        Resolver(ResolverSettings(default_transport=":x"))


def test_table_with_other_transport_and_empty_nexthop_uses_relayhost() -> None:
    """A "relay:" value keeps the transport but takes the relayhost/domain, not default_transport's
    nexthop (that belongs to the default transport)."""
    settings = ResolverSettings(
        default_transport="smtp:[10.1.1.1]",
        relayhost="[127.0.0.1]",
        transport_table=make_table("inline:{ x.test=relay:, y.test=: }"),
    )
    r = Resolver(settings)
    assert r.resolve("u@x.test") == Resolved("relay", "[127.0.0.1]", "u@x.test")
    assert r.resolve("u@y.test") == Resolved("smtp", "[10.1.1.1]", "u@y.test")


@pytest.mark.parametrize(
    ("address", "nexthop"),
    [
        ("", "5.1.3 null recipient address"),
        ("<>", "5.1.3 null recipient address"),
        ("no-at-sign", "5.1.3 bad address syntax"),
        ("@x.test", "5.1.3 bad address syntax"),
        ("u@", "5.1.3 bad address syntax"),
        ("u v@x.test", "5.1.3 bad address syntax"),
        ("u@x..test", "5.1.3 bad address syntax"),
        ("u@x_test!", "5.1.3 bad address syntax"),
        ("a@b@x.test", "5.1.3 bad address syntax"),
        ("u@[1.2.3.4", "5.1.3 bad address syntax"),
    ],
)
def test_bad_and_null_addresses_go_to_error(address: str, nexthop: str) -> None:
    """Unroutable addresses resolve to the error transport with a 5.1.3 text, never raise."""
    assert resolver().resolve(address) == Resolved("error", nexthop, address)


@pytest.mark.parametrize("address", ['"sp ace"@x.test', '" "@x.test', '"a\\ b"@x.test'])
def test_quoted_local_part_with_space_is_routed_unchanged(address: str) -> None:
    """A quoted local part may contain spaces (RFC 5321 §4.1.2): routed, address unchanged."""
    assert Resolver(ResolverSettings()).resolve(address) == Resolved("smtp", "x.test", address)


def test_control_character_is_bad_syntax_even_quoted() -> None:
    """A control character is bad syntax even inside a quoted local part."""
    assert Resolver(ResolverSettings()).resolve('"a\x1bb"@x.test').transport == "error"


def test_quoted_local_part_with_at_sign_is_accepted() -> None:
    """A quoted local part may contain '@'; the domain is after the last '@'."""
    assert Resolver(ResolverSettings()).resolve('"a@b"@x.test').nexthop == "x.test"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("error:5.7.1 go away", ("error", "5.7.1 go away")),
        ("error:no such user", ("error", "5.0.0 no such user")),
        ("error:", ("error", "5.0.0 mail delivery failed")),
        ("retry:4.3.5 system busy", ("retry", "4.3.5 system busy")),
        ("retry:busy", ("retry", "4.0.0 busy")),
        ("retry:", ("retry", "4.0.0 mail delivery deferred")),
        ("error:5.1.1 user: unknown", ("error", "5.1.1 user: unknown")),
    ],
)
def test_error_and_retry_keep_their_text(value: str, expected: tuple[str, str]) -> None:
    """error:/retry: values keep their text as the nexthop, with a default DSN code if absent."""
    t = make_table(f"inline:{{ {{ x.test = {value} }} }}")
    r = Resolver(ResolverSettings(relayhost="[127.0.0.1]", transport_table=t))
    got = r.resolve("u@x.test")
    assert (got.transport, got.nexthop) == expected


def test_default_transport_error() -> None:
    """default_transport = error:text sends everything to error with that text."""
    r = Resolver(ResolverSettings(default_transport="error:5.3.2 mail is disabled"))
    assert r.resolve("u@x.test") == Resolved("error", "5.3.2 mail is disabled", "u@x.test")


def test_defer_transports_without_and_with_flush() -> None:
    """A deferred transport becomes retry "4.3.2 deferred transport" unless flushing."""
    r = resolver(defer_transports=frozenset({"smtp"}))
    assert r.resolve("u@elsewhere.test") == Resolved(
        "retry", "4.3.2 deferred transport", "u@elsewhere.test"
    )
    assert r.resolve("u@elsewhere.test", flush=True) == Resolved(
        "smtp", "fallback.example", "u@elsewhere.test"
    )
    # other transports are unaffected
    assert r.resolve("u@deep.sub.example.com").transport == "relay"


@pytest.mark.parametrize(
    ("resolved", "limit", "delimiter", "name"),
    [
        (Resolved("smtp", "Example.COM", "u@example.com"), 50, "", "example.com"),
        (Resolved("smtp", "[10.0.0.1]:2525", "u@x"), 0, "", "[10.0.0.1]:2525"),
        (Resolved("local", "Host.Test", "Bob+Tag@host.test"), 1, "+", "bob@host.test"),
        (Resolved("local", "host.test", "bob+tag@host.test"), 1, "", "bob+tag@host.test"),
        (Resolved("local", "host.test", "bob-x+y@host.test"), 1, "+-", "bob@host.test"),
        (Resolved("local", "host.test", "+bob@host.test"), 1, "+", "+bob@host.test"),
        (Resolved("local", "h", "bob"), 1, "", "bob@h"),
        (Resolved("error", "5.1.3 Bad Syntax", "u@x"), 1, "+", "5.1.3 bad syntax"),
        (Resolved("retry", "4.3.2 deferred transport", "u@x"), 1, "", "4.3.2 deferred transport"),
    ],
)
def test_queue_name(resolved: Resolved, limit: int, delimiter: str, name: str) -> None:
    """Queue name: the nexthop, or localpart@nexthop without extension when the recipient limit
    is 1 (not for error/retry); always lowercased."""
    assert queue_name(resolved, recipient_limit=limit, recipient_delimiter=delimiter) == name


def test_sender_dependent_relayhost_overrides_relayhost() -> None:
    """sender_dependent_relayhost_maps: address, then @domain, then <> for the null sender."""
    table = {
        "alice@src.test": "[alice-relay]:587",
        "@src.test": "[src-relay]",
        "<>": "[bounce-relay]",
    }
    settings = ResolverSettings(relayhost="[main-relay]", sender_relayhost=table.get)
    r = Resolver(settings)
    assert r.resolve("u@x.test", sender="alice@src.test").nexthop == "[alice-relay]:587"
    assert r.resolve("u@x.test", sender="bob@src.test").nexthop == "[src-relay]"
    assert r.resolve("u@x.test", sender="").nexthop == "[bounce-relay]"
    assert r.resolve("u@x.test", sender="carol@other.test").nexthop == "[main-relay]"
    assert r.resolve("u@x.test").nexthop == "[main-relay]"  # sender unknown


def test_transport_map_nexthop_wins_over_sender_dependent_relayhost() -> None:
    """An explicit transport_maps nexthop is not overridden by the sender's relayhost."""
    settings = ResolverSettings(
        transport_table=make_table("inline:{ x.test=smtp:[mapped] }"),
        sender_relayhost={"@src.test": "[src-relay]"}.get,
    )
    r = Resolver(settings)
    assert r.resolve("u@x.test", sender="a@src.test").nexthop == "[mapped]"
    assert r.resolve("u@y.test", sender="a@src.test").nexthop == "[src-relay]"


def _domain_of_reference(address: str) -> str | None:
    """_domain_of as it was written character by character (the reference)."""
    at = address.rfind("@")
    if at <= 0 or at == len(address) - 1:
        return None
    if any(ord(ch) < 0x20 or ch == "\x7f" for ch in address):
        return None
    local, domain = address[:at], address[at + 1 :]
    quoted = len(local) >= 2 and local.startswith('"') and local.endswith('"')
    if not quoted and any(ch.isspace() for ch in local):
        return None
    if "@" in local and not quoted:
        return None
    if domain.startswith("["):
        return domain.lower() if _LITERAL_RE.match(domain) else None
    domain = domain.rstrip(".") if domain.endswith(".") and len(domain) > 1 else domain
    label = re.compile(r"^[A-Za-z0-9_\-\u0080-\U0010ffff]+$")
    if any(not label.match(part) for part in domain.split(".")):
        return None
    return domain.lower()


_PIECES = st.sampled_from(
    ["a", "B", "0", "_", "-", ".", "@", '"', " ", "\t", "\n", "\x00", "\x7f", "\x85", "\u00a0",
     "\u2028", "é", "ü", "[", "]", ":", "1.2.3.4", "\U0001f600", "x.", ".."]
)


@settings(max_examples=2000, deadline=None)
@given(st.lists(_PIECES, max_size=12).map("".join) | st.text(max_size=16))
def test_domain_checks_by_regular_expression_equal_the_character_walk(address: str) -> None:
    """The regular expressions accept and reject exactly what the per-character checks did."""
    assert _domain_of(address) == _domain_of_reference(address)
