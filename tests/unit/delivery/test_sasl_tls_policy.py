"""SASL credential lookup order and mechanism choice; TLS protocol lists and name matching."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from qmgrd.delivery.mx import Destination, Endpoint
from qmgrd.delivery.replies import Failure
from qmgrd.delivery.sasl import Credentials, SaslClient
from qmgrd.delivery.tlspolicy import TlsClient, TlsPolicy, certificate_names, parse_protocols
from qmgrd.errors import ConfigError
from qmgrd.tables import open_table

RELAY = Destination("smtp.example.net", 587, mx=False)
RELAY_EP = Endpoint("smtp.example.net", "192.0.2.1", 587)
MX_DEST = Destination("example.org", 25, mx=True)
MX_EP = Endpoint("mx1.example.org", "192.0.2.2", 25, 10)


def _client(entries: str, **kwargs: object) -> SaslClient:
    table = open_table(f"inline:{{ {entries} }}", base_dir=Path("."))
    return SaslClient(enable=True, password_maps=(table,), **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("entries", "user"),
    [
        ("[smtp.example.net]:587=a:1, [smtp.example.net]=b:2, smtp.example.net=c:3", "a"),
        ("[smtp.example.net]=b:2, smtp.example.net=c:3", "b"),
        ("smtp.example.net=c:3", "c"),
        ("[other]:587=x:1", None),
    ],
)
def test_relayhost_lookup_order(entries: str, user: str | None) -> None:
    """[host]:port first, then [host], then the host name (Postfix's order)."""
    found = _client(entries).credentials("s@src.test", RELAY, RELAY_EP)
    assert (found.username if found else None) == user


def test_mx_destination_lookup_by_server_then_domain() -> None:
    """For an MX destination the server's host name wins over the nexthop domain."""
    both = _client("mx1.example.org=server:1, example.org=domain:2")
    domain_only = _client("example.org=domain:2")
    assert both.credentials("", MX_DEST, MX_EP) == Credentials("server", "1")
    assert domain_only.credentials("", MX_DEST, MX_EP) == Credentials("domain", "2")


def test_sender_entries_only_with_sender_dependent_authentication() -> None:
    """Sender keys (address, then @domain) are used only when sender-dependent auth is on."""
    entries = "alice@src.test=alice:1, @src.test=dom:2, [smtp.example.net]:587=host:3"
    off = _client(entries)
    on = _client(entries, sender_dependent=True)
    assert off.credentials("alice@src.test", RELAY, RELAY_EP) == Credentials("host", "3")
    assert on.credentials("alice@src.test", RELAY, RELAY_EP) == Credentials("alice", "1")
    assert on.credentials("bob@src.test", RELAY, RELAY_EP) == Credentials("dom", "2")
    assert on.credentials("", RELAY, RELAY_EP) == Credentials("host", "3")


def test_password_is_never_in_repr() -> None:
    """Credentials print without their password."""
    assert "s3cret" not in repr(Credentials("u", "s3cret"))


@pytest.mark.parametrize(
    ("options", "tls_options", "tls", "filt", "expected"),
    [
        (("noplaintext", "noanonymous"), None, True, (), ["CRAM-MD5"]),
        (
            ("noplaintext", "noanonymous"),
            ("noanonymous",),
            True,
            (),
            ["CRAM-MD5", "PLAIN", "LOGIN"],
        ),
        (("noplaintext", "noanonymous"), ("noanonymous",), False, (), ["CRAM-MD5"]),
        (("noanonymous",), None, False, ("login",), ["LOGIN"]),
        (("nodictionary",), None, True, (), []),
    ],
)
def test_mechanisms_follow_security_options_and_filter(
    options: tuple[str, ...],
    tls_options: tuple[str, ...] | None,
    tls: bool,
    filt: tuple[str, ...],
    expected: list[str],
) -> None:
    """Security options (TLS or not) and the mechanism filter decide the usable mechanisms."""
    client = _client(
        "x=u:p",
        security_options=options,
        tls_security_options=tls_options,
        mechanism_filter=filt,
    )
    assert client.mechanisms(["PLAIN", "LOGIN", "CRAM-MD5", "XOAUTH2"], tls) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (">=TLSv1", ("TLSv1", "TLSv1.3")),
        (">=TLSv1.2", ("TLSv1.2", "TLSv1.3")),
        ("!SSLv2, !SSLv3, !TLSv1, !TLSv1.1", ("TLSv1.2", "TLSv1.3")),
        ("TLSv1.3", ("TLSv1.3", "TLSv1.3")),
        ("<=TLSv1.2", ("SSLv2", "TLSv1.2")),
    ],
)
def test_protocol_lists(text: str, expected: tuple[str, str]) -> None:
    """Postfix protocol syntax (>=, <=, !, inclusion) gives the allowed range."""
    assert parse_protocols(text, "p") == expected


@pytest.mark.parametrize("text", ["TLSv9", ">=TLSv1.3 !TLSv1.3", "SSLv4"])
def test_bad_protocol_lists(text: str) -> None:
    """Unknown protocols and empty ranges are configuration errors naming the parameter."""
    with pytest.raises(ConfigError, match="smtp_tls_mandatory_protocols"):
        parse_protocols(text, "smtp_tls_mandatory_protocols")


def _check(
    policy: TlsPolicy, names: list[tuple[str, str]], dest: Destination, ep: Endpoint
) -> bool:
    peercert = {"subjectAltName": tuple(names)}
    return TlsClient(level="none").check_peer(policy, peercert, dest, ep)


def test_name_matching_strategies() -> None:
    """hostname, nexthop, dot-nexthop, literal and .domain strategies match as Postfix's."""
    dns = [("DNS", "mx1.example.org")]
    verify = TlsPolicy("verify", ("hostname",))
    secure = TlsPolicy("secure", ("nexthop", "dot-nexthop"))
    assert _check(verify, dns, MX_DEST, MX_EP)
    assert _check(secure, dns, MX_DEST, MX_EP)  # dot-nexthop: a subdomain of example.org
    assert not _check(TlsPolicy("secure", ("nexthop",)), dns, MX_DEST, MX_EP)
    assert _check(TlsPolicy("secure", (".example.org",)), dns, MX_DEST, MX_EP)
    assert not _check(TlsPolicy("secure", ("other.example",)), dns, MX_DEST, MX_EP)
    wildcard = [("DNS", "*.example.org")]
    assert _check(verify, wildcard, MX_DEST, MX_EP)
    deep = Endpoint("a.b.example.org", "192.0.2.3", 25)
    assert not _check(verify, wildcard, MX_DEST, deep)  # one label only (RFC 6125)
    ip = [("IP Address", "192.0.2.1")]
    literal = Destination("192.0.2.1", 25, mx=False)
    assert _check(verify, ip, literal, Endpoint("192.0.2.1", "192.0.2.1", 25))


def test_common_name_only_without_dns_names() -> None:
    """The subject CN counts only when the certificate has no DNS subjectAltName."""
    cn = {"subject": ((("commonName", "mx1.example.org"),),)}
    both = {**cn, "subjectAltName": (("DNS", "other.example"),)}
    assert certificate_names(cn) == ["mx1.example.org"]
    assert certificate_names(both) == ["other.example"]


def test_policy_map_lookup_and_attributes() -> None:
    """Policy entries by nexthop label give level, match and protocols; bad ones defer."""
    table = open_table(
        "inline:{ { [smtp.example.net]:587 = secure match=.example.net protocols=>=TLSv1.2 }, "
        "example.org=verify, bad.example=dane, { odd.example = encrypt frobnicate=yes } }",
        base_dir=Path("."),
    )
    client = TlsClient(level="may", policy_maps=(table,))
    relay = client.policy_for(RELAY)
    assert relay == TlsPolicy("secure", (".example.net",), ("TLSv1.2", "TLSv1.3"))
    mx = client.policy_for(MX_DEST)
    assert isinstance(mx, TlsPolicy) and (mx.level, mx.match) == ("verify", ("hostname",))
    other = client.policy_for(Destination("elsewhere.example", 25, mx=True))
    assert isinstance(other, TlsPolicy) and other.level == "may"
    for name in ("bad.example", "odd.example"):
        failure = client.policy_for(Destination(name, 25, mx=True))
        assert isinstance(failure, Failure) and failure.dsn == "4.7.5"


def test_cert_match_parameters_choose_the_names() -> None:
    """smtp_tls_verify_cert_match / smtp_tls_secure_cert_match decide which names are accepted."""
    cert = {"subjectAltName": (("DNS", "example.org"),)}  # the domain, not the MX host name
    default = TlsClient(level="verify")
    by_nexthop = TlsClient(level="verify", verify_cert_match=("nexthop",))
    strict_secure = TlsClient(level="secure", secure_cert_match=("hostname",))
    for client, expected in ((default, False), (by_nexthop, True)):
        policy = client.default_policy()
        assert client.check_peer(policy, cert, MX_DEST, MX_EP) is expected
    secure = strict_secure.default_policy()
    assert secure.match == ("hostname",)
    assert not strict_secure.check_peer(secure, cert, MX_DEST, MX_EP)
    assert TlsClient(level="secure").check_peer(
        TlsClient(level="secure").default_policy(), cert, MX_DEST, MX_EP
    )


async def test_undecodable_password_is_sent_as_its_bytes_and_never_shown() -> None:
    """A password with bytes that are not UTF-8 is sent as those bytes; no exception shows it."""
    from qmgrd.delivery.client import Reply

    secret = b"pa\xffss".decode("utf-8", "surrogateescape")
    sent: list[bytes] = []

    async def command(stage: str, *args: bytes) -> Reply:
        sent.extend(args)
        return Reply(235, "2.7.0 ok")

    client = _client("x=u:p", security_options=("noanonymous",))
    failure = await client.authenticate(command, Credentials("u", secret), ["PLAIN"], True, "r")
    assert failure is None
    assert base64.b64decode(sent[-1]) == b"\0u\0pa\xffss"
