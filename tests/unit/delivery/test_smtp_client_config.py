"""Bad SMTP client configuration (TLS, SASL, routing) is a ConfigError at start, never later."""

from __future__ import annotations

from pathlib import Path

import pytest
import trustme

from qmgrd.config import load_config
from qmgrd.daemon.assemble import create_agents
from qmgrd.delivery.settings import SmtpSettings, open_lookup
from qmgrd.delivery.smtp import SmtpAgent
from qmgrd.errors import ConfigError

SECRET = "hunter2-secret"


def _agents_error(tmp_path: Path, main: str) -> str:
    (tmp_path / "main.cf").write_text(f"queue_directory = {tmp_path / 'spool'}\n{main}")
    (tmp_path / "master.cf").write_text("smtp unix - - n - - smtp\n")
    with pytest.raises(ConfigError) as info:  # at load (config checks) or at agent creation
        create_agents(load_config(tmp_path, hostname="mx.test"))
    return str(info.value)


@pytest.mark.parametrize(
    ("main", "words"),
    [
        ("smtp_tls_CAfile = missing-ca.pem\n", ["smtp_tls_CAfile", "missing-ca.pem"]),
        ("smtp_tls_CApath = /nonexistent/certs\n", ["smtp_tls_CApath", "/nonexistent/certs"]),
        (
            "smtp_sasl_auth_enable = yes\nsmtp_sasl_password_maps = texthash:absent\n",
            ["smtp_sasl_password_maps", "absent"],
        ),
        ("smtp_sasl_security_options = noplaintext, nosuch\n", ["smtp_sasl_security_options"]),
        ("smtp_sasl_tls_security_options = bogus\n", ["smtp_sasl_tls_security_options"]),
        ("smtp_tls_mandatory_protocols = >=TLSv9\n", ["smtp_tls_mandatory_protocols"]),
        (
            "smtp_tls_wrappermode = yes\nsmtp_tls_security_level = may\n",
            ["smtp_tls_wrappermode", "encrypt"],
        ),
        ("smtp_sasl_auth_enable = yes\n", ["smtp_sasl_password_maps"]),
        ("smtp_fallback_relay = [unbalanced\n", ["smtp_fallback_relay"]),
        ("relayhost = [smtp.example.net:587\n", ["relayhost", "]"]),
        ("relayhost = [smtp.example.net]:99999\n", ["relayhost", "port"]),
        ("smtp_tls_policy_maps = hash:/etc/nope\n", ["smtp_tls_policy_maps", "hash"]),
        ("smtp_helo_name = bad name\n", ["smtp_helo_name"]),
    ],
)
def test_bad_client_settings_refuse_to_start(tmp_path: Path, main: str, words: list[str]) -> None:
    """Each bad value stops agent creation (start or reload) with an error naming it."""
    message = _agents_error(tmp_path, main)
    for word in words:
        assert word in message


def test_bad_password_map_line_names_file_and_line_not_the_secret(tmp_path: Path) -> None:
    """A malformed password map line is reported by file and line, without its text."""
    (tmp_path / "sasl_passwd").write_text(f"[relay.test]:587 u:p\n{SECRET}\n")
    message = _agents_error(
        tmp_path,
        "smtp_sasl_auth_enable = yes\nsmtp_sasl_password_maps = texthash:sasl_passwd\n",
    )
    assert "sasl_passwd, line 2" in message and "smtp_sasl_password_maps" in message
    assert SECRET not in message


def test_unreadable_ca_file_content_is_refused(tmp_path: Path) -> None:
    """A CA file that is not PEM is refused at start, naming the file."""
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    message = _agents_error(tmp_path, "smtp_tls_CAfile = ca.pem\n")
    assert "ca.pem" in message


@pytest.mark.parametrize("level", ["dane", "dane-only", "fingerprint"])
def test_unsupported_levels_are_refused_with_a_reason(level: str) -> None:
    """dane, dane-only and fingerprint are refused with the reason, not silently weakened."""
    with pytest.raises(ConfigError, match="smtp_tls_security_level"):
        SmtpSettings(tls_security_level=level)


def test_valid_smarthost_config_builds_agents(tmp_path: Path) -> None:
    """The issue's smarthost lines with a CA file and a policy map build agents."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    passwd = tmp_path / "sasl_passwd"
    passwd.write_text("[smtp.example.net]:587 user:pass\n")
    passwd.chmod(0o600)
    (tmp_path / "main.cf").write_text(
        f"queue_directory = {tmp_path / 'spool'}\n"
        "relayhost = [smtp.example.net]:587\n"
        "smtp_sasl_auth_enable = yes\n"
        "smtp_sasl_password_maps = texthash:sasl_passwd\n"
        "smtp_sasl_security_options = noanonymous\n"
        "smtp_tls_security_level = verify\n"
        "smtp_tls_CAfile = ca.pem\n"
        "smtp_tls_policy_maps = inline:{ [smtp.example.net]:587=secure }\n"
    )
    (tmp_path / "master.cf").write_text("smtp unix - - n - - smtp\n")
    cfg = load_config(tmp_path, hostname="mx.test")
    assert not [w for w in cfg.warnings if "unused parameter" in w]
    agent = create_agents(cfg)["smtp"]
    assert isinstance(agent, SmtpAgent)
    assert agent.settings.sasl_auth_enable and agent.settings.tls_security_level == "verify"


def test_open_lookup_searches_tables_in_order(tmp_path: Path) -> None:
    """open_lookup chains a list parameter's tables: the first table holding the key wins."""
    (tmp_path / "relays").write_text("@src.test [file-relay]\nbob@src.test [bob-relay]\n")
    (tmp_path / "main.cf").write_text(
        f"queue_directory = {tmp_path / 'spool'}\n"
        "smtp_tls_policy_maps = inline:{ @src.test=[inline-relay] }, texthash:relays\n"
    )
    (tmp_path / "master.cf").write_text("smtp unix - - n - - smtp\n")
    cfg = load_config(tmp_path, hostname="mx.test")
    lookup = open_lookup(cfg, "smtp_tls_policy_maps")
    assert lookup is not None
    assert lookup("@SRC.test") == "[inline-relay]"
    assert lookup("bob@src.test") == "[bob-relay]"
    assert lookup("nobody@else.test") is None
    assert open_lookup(cfg, "smtp_sasl_password_maps") is None
