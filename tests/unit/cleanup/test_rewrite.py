"""Envelope and header address rewriting; cleanup settings read from main.cf."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qmgrd.cleanup import (
    AddressRewriter,
    CleanupSettings,
    Role,
    rewrite_header_value,
    rewrite_recipient,
    rewrite_sender,
)
from qmgrd.config import load_config
from qmgrd.errors import ConfigError
from qmgrd.tables import open_table

ROOT = Path("/")
MASTER = "smtp unix - - n - - smtp\n"


def rw(**kwargs: object) -> AddressRewriter:
    return AddressRewriter(myorigin="origin.example", mydomain="example.net", **kwargs)  # type: ignore[arg-type]


def test_qualify_bare_local_part() -> None:
    """root -> root@$myorigin; the null sender stays empty."""
    assert rw().qualify("root") == "root@origin.example"
    assert rw().qualify("") == ""
    assert rw(append_at_myorigin=False).qualify("root") == "root"


def test_append_dot_mydomain() -> None:
    """user@host -> user@host.$mydomain only with append_dot_mydomain = yes."""
    assert rw().qualify("u@host") == "u@host"
    assert rw(append_dot_mydomain=True).qualify("u@host") == "u@host.example.net"
    assert rw(append_dot_mydomain=True).qualify("u@[10.0.0.1]") == "u@[10.0.0.1]"


def test_canonical_order_and_at_domain_result() -> None:
    """canonical(5): user@d beats @d; an @domain result keeps the local part."""
    table = open_table(
        "inline:{ joe@old.example=joseph@new.example, @old.example=@new.example }", base_dir=ROOT
    )
    r = rw(canonical_maps=(table,))
    assert r.rewrite("joe@old.example", Role.ENVELOPE_SENDER) == "joseph@new.example"
    assert r.rewrite("ann@old.example", Role.HEADER_RECIPIENT) == "ann@new.example"
    assert r.rewrite("ann@other.example", Role.HEADER_RECIPIENT) == "ann@other.example"


def test_sender_canonical_only_for_senders() -> None:
    """sender_canonical_maps does not touch recipients; recipient_canonical_maps the reverse."""
    s_table = open_table("inline:{ root@origin.example=admin@corp.example }", base_dir=ROOT)
    r = rw(sender_canonical_maps=(s_table,))
    assert r.rewrite("root", Role.ENVELOPE_SENDER) == "admin@corp.example"
    assert r.rewrite("root", Role.ENVELOPE_RECIPIENT) == "root@origin.example"


def test_canonical_classes_restrict() -> None:
    """canonical_classes = envelope_sender leaves header addresses alone."""
    table = open_table("inline:{ a@x.example=b@x.example }", base_dir=ROOT)
    r = rw(canonical_maps=(table,), canonical_classes=frozenset({Role.ENVELOPE_SENDER}))
    assert r.rewrite("a@x.example", Role.ENVELOPE_SENDER) == "b@x.example"
    assert r.rewrite("a@x.example", Role.HEADER_SENDER) == "a@x.example"


def test_extension_propagated() -> None:
    """A match on user@d (without +ext) gives the extension back."""
    table = open_table("inline:{ joe@x.example=jo@y.example }", base_dir=ROOT)
    r = rw(canonical_maps=(table,), recipient_delimiter="+")
    assert r.rewrite("joe+list@x.example", Role.ENVELOPE_RECIPIENT) == "jo+list@y.example"


def test_canonical_loop_is_bounded() -> None:
    """a -> b -> a stops (at most 10 rounds) instead of looping."""
    table = open_table("inline:{ a@x.example=b@x.example, b@x.example=a@x.example }", base_dir=ROOT)
    out = rw(canonical_maps=(table,)).rewrite("a@x.example", Role.ENVELOPE_SENDER)
    assert out in ("a@x.example", "b@x.example")


def test_regexp_canonical() -> None:
    """A regexp: canonical table sees the full address."""
    table = open_table("regexp:{{/^(.*)@host\\.example$/ $1@example.com}}", base_dir=ROOT)
    assert rw(canonical_maps=(table,)).rewrite("u@host.example", Role.ENVELOPE_SENDER) == (
        "u@example.com"
    )


def test_masquerade() -> None:
    """Subdomains are stripped; !exclusions and masquerade_exceptions are honoured."""
    r = rw(
        masquerade_domains=("!keep.example.com", "example.com"),
        masquerade_exceptions=frozenset({"root"}),
    )
    assert r.rewrite("u@a.b.example.com", Role.ENVELOPE_SENDER) == "u@example.com"
    assert r.rewrite("u@example.com", Role.ENVELOPE_SENDER) == "u@example.com"
    assert r.rewrite("u@x.keep.example.com", Role.ENVELOPE_SENDER) == "u@x.keep.example.com"
    assert r.rewrite("root@a.example.com", Role.ENVELOPE_SENDER) == "root@a.example.com"
    # envelope recipients are not in masquerade_classes by default
    assert r.rewrite("u@a.example.com", Role.ENVELOPE_RECIPIENT) == "u@a.example.com"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (" root", " ROOT"),
        (' "Doe, John" <jd>, x (c)', ' "Doe, John" <JD>, X (c)'),
        (" group: a, b;", " group: A, B;"),
        (" <@route:u@h>", " <@route:U@H>"),
        (" Name <unbalanced", " Name <unbalanced"),
        (" two words", " two words"),
        (" a,\r\n\tb", " A,\r\n\tB"),
    ],
)
def test_header_value_rewriting(value: str, expected: str) -> None:
    """Addresses in header values are rewritten in place, everything else kept."""
    assert rewrite_header_value(value, str.upper) == expected


@given(st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_header_value_rewriting_never_raises(value: str) -> None:
    """Any text: no exception, and the identity function changes nothing."""
    assert rewrite_header_value(value, lambda a: a) == value


def _load(tmp_path: Path, main: str) -> CleanupSettings:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(MASTER)
    return CleanupSettings.from_config(load_config(tmp_path, hostname="h.example"))


def test_settings_from_config(tmp_path: Path) -> None:
    """myorigin, canonical_maps and masquerade_domains from main.cf reach the rewriting."""
    (tmp_path / "canon").write_text("@old.example @new.example\n")
    s = _load(
        tmp_path,
        "myorigin = origin.example\ncanonical_maps = texthash:canon\n"
        "masquerade_domains = corp.example\n",
    )
    assert rewrite_sender(s, "root") == "root@origin.example"
    assert rewrite_recipient(s, "a@old.example") == "a@new.example"
    assert rewrite_sender(s, "a@mx.corp.example") == "a@corp.example"
    assert s.hopcount_limit == 50 and s.header_size_limit == 102400


def test_myorigin_defaults_to_myhostname(tmp_path: Path) -> None:
    """myorigin defaults to $myhostname, as in Postfix."""
    s = _load(tmp_path, "")
    assert rewrite_sender(s, "root") == "root@h.example"


def test_header_checks_unsupported_action_is_config_error(tmp_path: Path) -> None:
    """A FILTER rule stops the start with file, line and parameter named."""
    (tmp_path / "hc").write_text("/^Subject:/ WARN ok\n/^X-Scan:/ FILTER smtp:[127.0.0.1]:10025\n")
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, "header_checks = regexp:hc\n")
    text = str(err.value)
    assert "header_checks" in text and "line 2" in text and "FILTER" in text


def test_header_checks_wrong_table_type(tmp_path: Path) -> None:
    """header_checks with a hash-like table is refused at start."""
    (tmp_path / "hc").write_text("a b\n")
    with pytest.raises(ConfigError, match="regexp: or pcre:"):
        _load(tmp_path, "header_checks = texthash:hc\n")


def test_header_checks_broken_line_names_file(tmp_path: Path) -> None:
    """A pattern that does not compile names the file and the line."""
    (tmp_path / "hc").write_text("/^Subject: (/ REJECT x\n")
    with pytest.raises(ConfigError, match="line 1"):
        _load(tmp_path, "header_checks = regexp:hc\n")


def test_local_header_rewrite_clients(tmp_path: Path) -> None:
    """permit_inet_interfaces: loopback and bound addresses are local; others are not."""
    s = _load(tmp_path, "")
    assert s.is_local_client("127.0.0.1")
    assert s.is_local_client("::1")
    assert s.is_local_client("192.0.2.7", interfaces=("192.0.2.7",))
    assert not s.is_local_client("192.0.2.8")
    assert s.is_local_client(None)
    s = _load(tmp_path, "local_header_rewrite_clients = permit_mynetworks\n")
    assert s.is_local_client("10.1.1.1", mynetworks=lambda a: a.startswith("10."))
    assert not s.is_local_client("127.0.0.1", mynetworks=lambda a: False)
    s = _load(tmp_path, "local_header_rewrite_clients = static:all\n")
    assert s.is_local_client("203.0.113.1")


def test_local_header_rewrite_clients_unknown(tmp_path: Path) -> None:
    """An unsupported local_header_rewrite_clients entry is a ConfigError."""
    with pytest.raises(ConfigError, match="local_header_rewrite_clients"):
        _load(tmp_path, "local_header_rewrite_clients = permit_tls_all_clientcerts\n")
