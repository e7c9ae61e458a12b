"""Client TLS like Postfix's: verify/secure, wrapper mode, policy maps, protocols, log lines."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trustme
from structlog.testing import capture_logs

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from qmgrd.tables import open_table
from tests.integration.sinks import SinkConfig, make_request, smtp_sink
from tests.integration.smarthost_sinks import SmarthostConfig, smarthost_sink


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """The test certificate authority (the one the client trusts)."""
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    """The test CA's certificate as a PEM file (smtp_tls_CAfile)."""
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def _server(
    ca: trustme.CA, *names: str, max_version: ssl.TLSVersion | None = None
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(ctx)
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def _settings(level: str, **kwargs: object) -> SmtpSettings:
    return SmtpSettings(
        helo_name="client.test",
        tls_security_level=level,
        connect_timeout=5,
        helo_timeout=5,
        starttls_timeout=5,
        tls_loglevel=1,
        **kwargs,  # type: ignore[arg-type]
    )


def _lines(logs: Sequence[Mapping[str, Any]], word: str) -> list[str]:
    return [str(e["event"]) for e in logs if word in str(e.get("event", ""))]


async def _deliver(settings: SmtpSettings, nexthop: str) -> tuple[Any, list[Any]]:
    agent = SmtpAgent(settings)
    with capture_logs() as logs:
        result = await agent.deliver(make_request(nexthop, ["a@x.test"]))
    await agent.close()
    return result, logs


async def test_verify_with_trusted_certificate_delivers(ca: trustme.CA, ca_file: str) -> None:
    """Level verify delivers to a server whose certificate the CA file trusts, logged Verified."""
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "127.0.0.1"))) as sink:
        result, logs = await _deliver(_settings("verify", tls_cafile=ca_file), sink.nexthop)
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].peer_tls is True
    (line,) = _lines(logs, "TLS connection established")
    relay = f"127.0.0.1[127.0.0.1]:{sink.port}"
    assert line.startswith(f"Verified TLS connection established to {relay}:")
    assert " with cipher " in line and "bits)" in line


@pytest.mark.parametrize("level", ["verify", "secure"])
async def test_other_ca_defers_untrusted(ca_file: str, level: str) -> None:
    """A certificate from another CA defers with 4.7.5 as a hop failure, Untrusted logged."""
    other = trustme.CA()
    async with smtp_sink(SinkConfig(tls_context=_server(other, "127.0.0.1"))) as sink:
        result, logs = await _deliver(_settings(level, tls_cafile=ca_file), sink.nexthop)
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn, rcpt.reply) == (
        Outcome.DEFERRED,
        "4.7.5",
        "Server certificate not trusted",
    )
    assert result.hop is not None and not sink.messages
    (line,) = _lines(logs, "Untrusted TLS connection")
    assert "127.0.0.1[127.0.0.1]" in line and "certificate verification failed" in line


@pytest.mark.parametrize("level", ["verify", "secure"])
async def test_wrong_name_defers_not_verified(ca: trustme.CA, ca_file: str, level: str) -> None:
    """A trusted certificate for another name defers with 4.7.5 "not verified"."""
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "other.test"))) as sink:
        result, logs = await _deliver(_settings(level, tls_cafile=ca_file), sink.nexthop)
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn, rcpt.reply) == (
        Outcome.DEFERRED,
        "4.7.5",
        "Server certificate not verified",
    )
    assert result.hop is not None and not sink.messages
    assert _lines(logs, "Trusted TLS connection established")


async def test_secure_matches_nexthop_and_literal_names(ca: trustme.CA, ca_file: str) -> None:
    """Level secure accepts the nexthop name by default and a literal name when configured."""
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "127.0.0.1"))) as sink:
        ok, _ = await _deliver(_settings("secure", tls_cafile=ca_file), sink.nexthop)
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "relay.example.test"))) as sink2:
        literal, _ = await _deliver(
            _settings("secure", tls_cafile=ca_file, tls_secure_cert_match=(".example.test",)),
            sink2.nexthop,
        )
    assert ok.recipients[0].outcome is Outcome.SENT
    assert literal.recipients[0].outcome is Outcome.SENT


async def test_may_logs_untrusted_connection(ca: trustme.CA) -> None:
    """Level may logs an unauthenticated session as Untrusted (smtp_tls_loglevel = 1)."""
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "127.0.0.1"))) as sink:
        result, logs = await _deliver(_settings("may"), sink.nexthop)
        quiet, quiet_logs = await _deliver(
            SmtpSettings(helo_name="client.test", tls_security_level="may", connect_timeout=5),
            sink.nexthop,
        )
    assert result.recipients[0].outcome is Outcome.SENT
    assert quiet.recipients[0].outcome is Outcome.SENT
    assert len(_lines(logs, "Untrusted TLS connection established to")) == 1
    assert _lines(quiet_logs, "TLS connection established") == []  # smtp_tls_loglevel = 0


async def test_wrappermode_delivers_to_implicit_tls(ca: trustme.CA, ca_file: str) -> None:
    """smtp_tls_wrappermode speaks TLS from the first byte (SMTPS) and verifies the server."""
    cfg = SmarthostConfig(implicit_tls=_server(ca, "127.0.0.1"), auth_required=False)
    async with smarthost_sink(cfg) as sink:
        result, logs = await _deliver(
            _settings("verify", tls_cafile=ca_file, tls_wrappermode=True), sink.nexthop
        )
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.tls_connections == 1 and len(sink.messages) == 1
    assert "STARTTLS" not in sink.commands
    assert _lines(logs, "Verified TLS connection established")


async def test_wrappermode_untrusted_defers(ca_file: str) -> None:
    """In wrapper mode an untrusted certificate defers with 4.7.5 too."""
    cfg = SmarthostConfig(implicit_tls=_server(trustme.CA(), "127.0.0.1"), auth_required=False)
    async with smarthost_sink(cfg) as sink:
        result, _ = await _deliver(
            _settings("verify", tls_cafile=ca_file, tls_wrappermode=True), sink.nexthop
        )
    assert (result.recipients[0].dsn, result.recipients[0].reply) == (
        "4.7.5",
        "Server certificate not trusted",
    )
    assert result.hop is not None


async def test_policy_map_requires_tls_for_one_destination(ca: trustme.CA, tmp_path: Path) -> None:
    """A policy map entry makes TLS mandatory for one destination; others keep the level."""
    tls_cfg = SinkConfig(tls_context=_server(ca, "127.0.0.1"))
    async with smtp_sink() as plain_a, smtp_sink() as plain_b, smtp_sink(tls_cfg) as tls_sink:
        table = open_table(
            f"inline:{{ {plain_a.nexthop}=encrypt, {tls_sink.nexthop}=encrypt }}",
            base_dir=tmp_path,
        )
        settings = _settings("none", tls_policy_maps=(table,))
        refused, _ = await _deliver(settings, plain_a.nexthop)
        other, _ = await _deliver(settings, plain_b.nexthop)
        encrypted, _ = await _deliver(settings, tls_sink.nexthop)
    assert (refused.recipients[0].outcome, refused.recipients[0].dsn) == (
        Outcome.DEFERRED,
        "4.7.4",
    )
    assert not plain_a.messages
    assert other.recipients[0].outcome is Outcome.SENT and plain_b.messages[0].peer_tls is False
    assert encrypted.recipients[0].outcome is Outcome.SENT
    assert tls_sink.messages[0].peer_tls is True


async def test_unusable_policy_entry_defers(tmp_path: Path) -> None:
    """A policy entry with dane (unsupported) defers with "client TLS configuration problem"."""
    async with smtp_sink() as sink:
        table = open_table(f"inline:{{ {sink.nexthop}=dane }}", base_dir=tmp_path)
        result, _ = await _deliver(_settings("may", tls_policy_maps=(table,)), sink.nexthop)
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn, rcpt.reply) == (
        Outcome.DEFERRED,
        "4.7.5",
        "client TLS configuration problem",
    )
    assert not sink.messages


async def test_mandatory_protocols_refuse_old_servers(ca: trustme.CA) -> None:
    """smtp_tls_mandatory_protocols = >=TLSv1.3 refuses a TLSv1.2-only server (4.7.5)."""
    server = _server(ca, "127.0.0.1", max_version=ssl.TLSVersion.TLSv1_2)
    async with smtp_sink(SinkConfig(tls_context=server)) as sink:
        strict, _ = await _deliver(
            _settings("encrypt", tls_mandatory_protocols=">=TLSv1.3"), sink.nexthop
        )
        default, _ = await _deliver(_settings("encrypt"), sink.nexthop)
    assert (strict.recipients[0].outcome, strict.recipients[0].dsn) == (
        Outcome.DEFERRED,
        "4.7.5",
    )
    assert default.recipients[0].outcome is Outcome.SENT


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl to hash the CA")
async def test_verify_with_capath_directory(ca: trustme.CA, tmp_path: Path) -> None:
    """smtp_tls_CApath: a hashed CA directory is trusted (and an empty one is not)."""
    pem = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    digest = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(pem)],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    trusted, empty = tmp_path / "certs", tmp_path / "empty"
    trusted.mkdir()
    empty.mkdir()
    shutil.copy(pem, trusted / f"{digest}.0")
    async with smtp_sink(SinkConfig(tls_context=_server(ca, "127.0.0.1"))) as sink:
        ok, _ = await _deliver(_settings("verify", tls_capath=str(trusted)), sink.nexthop)
        bad, _ = await _deliver(_settings("verify", tls_capath=str(empty)), sink.nexthop)
    assert ok.recipients[0].outcome is Outcome.SENT
    assert (bad.recipients[0].outcome, bad.recipients[0].dsn) == (Outcome.DEFERRED, "4.7.5")
