"""Pure parts of listener TLS and inet services: protocol lists, inet service fields, levels."""

from __future__ import annotations

import ssl

import pytest

from qmgrd.config.files import inet_endpoint
from qmgrd.errors import ConfigError
from qmgrd.listener.auth import auth_allowed
from qmgrd.listener.tls import TlsSettings, protocol_range

V12, V13 = ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (">=TLSv1", (V12, V13)),
        (">=TLSv1.3", (V13, V13)),
        ("!SSLv2, !SSLv3, !TLSv1, !TLSv1.1", (V12, V13)),
        ("!TLSv1.3", (V12, V12)),
        ("<=TLSv1.2", (V12, V12)),
        ("TLSv1.2:TLSv1.3", (V12, V13)),
    ],
)
def test_protocol_lists_in_both_postfix_syntaxes(
    text: str, expected: tuple[ssl.TLSVersion, ssl.TLSVersion]
) -> None:
    """Postfix's ``>=`` and ``!`` protocol syntaxes give the allowed version range."""
    assert protocol_range(text, "smtpd_tls_protocols") == expected


@pytest.mark.parametrize("text", ["!TLSv1.2 !TLSv1.3", "<=TLSv1.1", ">=TLSv9", "SSLv3", "bogus"])
def test_bad_or_empty_protocol_lists_are_config_errors(text: str) -> None:
    """A list that names an unknown protocol or allows none qmgrd offers is a ConfigError."""
    with pytest.raises(ConfigError, match="smtpd_tls_protocols"):
        protocol_range(text, "smtpd_tls_protocols")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("submission", (None, 587)),
        ("smtps", (None, 465)),
        ("2525", (None, 2525)),
        ("127.0.0.1:2525", ("127.0.0.1", 2525)),
        ("*:587", ("", 587)),
        ("[::1]:587", ("::1", 587)),
        ("localhost:submission", ("localhost", 587)),
    ],
)
def test_inet_service_fields(name: str, expected: tuple[str | None, int]) -> None:
    """A master.cf inet service field is a port, a service name or host:port."""
    assert inet_endpoint(name) == expected


@pytest.mark.parametrize("name", ["no-such-service-x", "::1:25", "[::1]", "70000"])
def test_bad_inet_service_fields(name: str) -> None:
    """An unknown service, an unbracketed IPv6 address or a bad port is a ValueError."""
    with pytest.raises(ValueError):
        inet_endpoint(name)


def test_levels_and_auth_only() -> None:
    """none offers nothing, encrypt requires TLS, wrapper mode never offers STARTTLS, and
    auth_only refuses clear-text AUTH even to loopback."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    assert not TlsSettings().starttls
    assert TlsSettings("may", ctx).starttls and not TlsSettings("may", ctx).required
    assert TlsSettings("encrypt", ctx).required
    assert not TlsSettings("may", ctx, wrappermode=True).starttls
    with pytest.raises(ConfigError):
        TlsSettings("sometimes", ctx)
    assert auth_allowed("127.0.0.1", tls=False)
    assert not auth_allowed("127.0.0.1", tls=False, auth_only=True)
    assert auth_allowed("192.0.2.1", tls=True, auth_only=True)
