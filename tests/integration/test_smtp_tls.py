"""STARTTLS per smtp_tls_security_level against sinks with trustme certificates."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.sinks import SinkConfig, make_request, smtp_sink


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> Iterator[str]:
    """The test CA's certificate as a PEM file (smtp_tls_CAfile)."""
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    yield str(path)


def _settings(level: str, **kwargs: Any) -> SmtpSettings:
    return SmtpSettings(
        helo_name="client.test",
        tls_security_level=level,
        connect_timeout=5,
        helo_timeout=5,
        starttls_timeout=5,
        **kwargs,
    )


async def test_may_uses_tls_when_offered(server_tls: ssl.SSLContext) -> None:
    """Level may upgrades with STARTTLS when offered, without verifying the certificate."""
    async with smtp_sink(SinkConfig(tls_context=server_tls)) as sink:
        agent = SmtpAgent(_settings("may"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].peer_tls is True
    assert sink.commands.count("EHLO") == 2  # EHLO again after STARTTLS (RFC 3207 §4.2)


async def test_may_without_starttls_sends_plaintext() -> None:
    """Level may delivers in plaintext to a server that does not offer STARTTLS."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings("may"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].peer_tls is False


async def test_may_falls_back_to_plaintext_after_failed_handshake(
    server_tls: ssl.SSLContext,
) -> None:
    """Level may reconnects in plaintext when the TLS handshake fails."""
    cfg = SinkConfig(tls_context=server_tls, break_starttls=True)
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(_settings("may"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert result.hop is None
    assert sink.connections == 2
    assert sink.messages[0].peer_tls is False


async def test_encrypt_uses_tls(server_tls: ssl.SSLContext) -> None:
    """Level encrypt delivers over TLS to a server offering STARTTLS."""
    async with smtp_sink(SinkConfig(tls_context=server_tls)) as sink:
        agent = SmtpAgent(_settings("encrypt"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].peer_tls is True


async def test_encrypt_without_starttls_defers_with_hop() -> None:
    """Level encrypt defers with 4.7.4 and a hop status when the server lacks STARTTLS."""
    async with smtp_sink() as sink:
        agent = SmtpAgent(_settings("encrypt"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.7.4")
    assert "TLS is required" in rcpt.reply
    assert result.hop is not None and not sink.messages


async def test_encrypt_failed_handshake_defers(server_tls: ssl.SSLContext) -> None:
    """Level encrypt does not fall back to plaintext when the handshake fails."""
    cfg = SinkConfig(tls_context=server_tls, break_starttls=True)
    async with smtp_sink(cfg) as sink:
        agent = SmtpAgent(_settings("encrypt"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.7.5")
    assert result.hop is not None
    assert sink.connections == 1 and not sink.messages


async def test_verify_checks_certificate(server_tls: ssl.SSLContext, ca_file: str) -> None:
    """Level verify succeeds with the right CA file and defers with an untrusted certificate."""
    async with smtp_sink(SinkConfig(tls_context=server_tls)) as sink:
        good = SmtpAgent(_settings("verify", tls_cafile=ca_file))
        ok = await good.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await good.close()
        other = trustme.CA()
        bad_file = Path(ca_file).with_name("other.pem")
        other.cert_pem.write_to_path(str(bad_file))
        bad = SmtpAgent(_settings("verify", tls_cafile=str(bad_file)))
        failed = await bad.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await bad.close()
    assert ok.recipients[0].outcome is Outcome.SENT
    assert (failed.recipients[0].outcome, failed.recipients[0].dsn) == (Outcome.DEFERRED, "4.7.5")
    assert failed.hop is not None
    assert len(sink.messages) == 1


async def test_quit_reaches_the_server_over_tls_without_waiting_for_its_reply(
    server_tls: ssl.SSLContext,
) -> None:
    """smtp_skip_quit_response (default): over TLS too, QUIT is written out before the close."""
    async with smtp_sink(SinkConfig(tls_context=server_tls)) as sink:
        agent = SmtpAgent(_settings("encrypt"))
        assert agent.settings.skip_quit_response
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await sink.wait_for(lambda: "QUIT" in sink.commands, "the QUIT over TLS")
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.messages[0].peer_tls is True
