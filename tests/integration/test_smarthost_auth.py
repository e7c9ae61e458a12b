"""Client SMTP AUTH against a smarthost sink: credentials, security options, failures."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
import trustme
from structlog.testing import capture_logs

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from qmgrd.tables import open_table
from tests.integration.sinks import SinkConfig, make_request
from tests.integration.smarthost_sinks import SmarthostConfig, smarthost_sink

PASSWORD = "s3cret-Pa55"


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    """A throwaway certificate authority."""
    return trustme.CA()


@pytest.fixture
def server_tls(ca: trustme.CA) -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 signed by the test CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


def _settings(tmp_path: Path, entries: str, **kwargs: object) -> SmtpSettings:
    path = tmp_path / "sasl_passwd"
    path.write_text(entries)
    path.chmod(0o600)
    table = open_table(f"texthash:{path}", base_dir=tmp_path)
    defaults: dict[str, object] = {
        "helo_name": "client.test",
        "connect_timeout": 5,
        "helo_timeout": 5,
        "starttls_timeout": 5,
        "tls_security_level": "encrypt",
        "sasl_auth_enable": True,
        "sasl_password_maps": (table,),
        "sasl_security_options": ("noanonymous",),
    }
    defaults.update(kwargs)
    return SmtpSettings(**defaults)  # type: ignore[arg-type]


@pytest.mark.parametrize("mechanism", ["PLAIN", "LOGIN"])
async def test_starttls_then_auth_delivers(
    tmp_path: Path, server_tls: ssl.SSLContext, mechanism: str
) -> None:
    """With the right credentials the client authenticates after STARTTLS and delivers."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:{PASSWORD}\n"
        agent = SmtpAgent(_settings(tmp_path, entries, sasl_mechanism_filter=(mechanism,)))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert [(a.mechanism, a.login, a.tls, a.ok) for a in sink.auth_attempts] == [
        (mechanism, "relayuser", True, True)
    ]
    assert sink.messages[0].peer_tls is True


async def test_wrong_password_defers_as_destination_failure(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """A 535 reply defers (soft bounce) with the server's words, as a hop failure, no password."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:wrong-{PASSWORD}\n"
        agent = SmtpAgent(_settings(tmp_path, entries))
        with capture_logs() as logs:
            result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.7.8")
    assert rcpt.reply.startswith("SASL authentication failed; server 127.0.0.1[127.0.0.1]:")
    assert "535" in rcpt.reply
    assert result.hop is not None and "535" in result.hop.reason
    assert not sink.messages
    assert PASSWORD not in repr(result) and PASSWORD not in repr(logs)


async def test_auth_soft_bounce_off_bounces(tmp_path: Path, server_tls: ssl.SSLContext) -> None:
    """With smtp_sasl_auth_soft_bounce = no a 535 is a permanent failure."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:nope\n"
        agent = SmtpAgent(_settings(tmp_path, entries, sasl_auth_soft_bounce=False))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.BOUNCED, "5.7.8")


async def test_default_options_send_no_credentials_in_plaintext(tmp_path: Path) -> None:
    """AUTH offered without TLS gets no credentials under noplaintext: deferred, not bounced."""
    cfg = SmarthostConfig(
        users={"relayuser": PASSWORD}, auth_required=False, auth_require_tls=False
    )
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:{PASSWORD}\n"
        settings = _settings(
            tmp_path,
            entries,
            tls_security_level="may",
            sasl_security_options=("noplaintext", "noanonymous"),
        )
        agent = SmtpAgent(settings)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert sink.auth_attempts == []
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.7.0")
    assert "no mechanism available" in rcpt.reply
    assert result.hop is not None


async def test_tls_security_options_allow_plain_over_tls_only(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """smtp_sasl_tls_security_options governs a TLS session: PLAIN allowed there only."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:{PASSWORD}\n"
        settings = _settings(
            tmp_path,
            entries,
            sasl_security_options=("noplaintext", "noanonymous"),
            sasl_tls_security_options=("noanonymous",),
        )
        agent = SmtpAgent(settings)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert [a.tls for a in sink.auth_attempts] == [True]


async def test_no_password_entry_means_no_auth(tmp_path: Path, server_tls: ssl.SSLContext) -> None:
    """Without a password map entry for the server the client does not authenticate."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), auth_required=False)
    async with smarthost_sink(cfg) as sink:
        agent = SmtpAgent(_settings(tmp_path, "[other.test]:587 u:p\n"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.auth_attempts == []


async def test_sender_dependent_credentials(tmp_path: Path, server_tls: ssl.SSLContext) -> None:
    """With sender-dependent authentication the sender's entry wins over the host's."""
    users = {"host-user": "hp", "alice": "ap", "domain-user": "dp"}
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users=users)
    async with smarthost_sink(cfg) as sink:
        entries = (
            f"{sink.nexthop} host-user:hp\nalice@src.test alice:ap\n@other.test domain-user:dp\n"
        )
        settings = _settings(tmp_path, entries, sender_dependent_authentication=True)
        agent = SmtpAgent(settings)
        for sender in ("alice@src.test", "bob@other.test", "carol@src.test"):
            result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"], sender=sender))
            assert result.recipients[0].outcome is Outcome.SENT
        await agent.close()
    assert [a.login for a in sink.auth_attempts] == ["alice", "domain-user", "host-user"]


async def test_cached_session_is_reused_only_for_the_same_user(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """A cached authenticated session is reused for the same SASL user, never for another."""
    users = {"alice": "ap", "bob": "bp"}
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users=users)
    async with smarthost_sink(cfg) as sink:
        entries = "alice@src.test alice:ap\nbob@src.test bob:bp\n"
        settings = _settings(
            tmp_path, entries, sender_dependent_authentication=True, tls_connection_reuse=True
        )
        agent = SmtpAgent(settings)
        for sender in ("alice@src.test", "alice@src.test", "bob@src.test", "alice@src.test"):
            request = make_request(
                sink.nexthop, ["a@x.test"], sender=sender, cache_load=True, cache_store=True
            )
            result = await agent.deliver(request)
            assert result.recipients[0].outcome is Outcome.SENT
        await agent.close()
    assert [a.login for a in sink.auth_attempts] == ["alice", "bob"]
    assert agent.stats.reused == 2 and sink.connections == 2


def test_world_readable_password_map_warns(tmp_path: Path) -> None:
    """A password map readable by other users produces a warning naming the file."""
    from qmgrd.config import load_config

    secrets = tmp_path / "sasl_passwd"
    secrets.write_text("[relay.test]:587 u:p\n")
    secrets.chmod(0o644)
    (tmp_path / "main.cf").write_text(
        f"queue_directory = {tmp_path / 'spool'}\n"
        "smtp_sasl_auth_enable = yes\n"
        "smtp_sasl_password_maps = texthash:sasl_passwd\n"
    )
    (tmp_path / "master.cf").write_text("smtp unix - - n - - smtp\n")
    cfg = load_config(tmp_path, hostname="mx.test")
    settings = SmtpSettings.from_transport(cfg.transport("smtp"))
    assert len(settings.warnings) == 1
    assert str(secrets) in settings.warnings[0] and "other users" in settings.warnings[0]
    secrets.chmod(0o600)
    assert SmtpSettings.from_transport(cfg.transport("smtp")).warnings == ()


async def test_cram_md5_never_sends_the_password(tmp_path: Path) -> None:
    """Under the default options CRAM-MD5 is used even without TLS: the password never crosses."""
    cfg = SmarthostConfig(
        users={"relayuser": PASSWORD}, auth_required=False, auth_require_tls=False, cram_md5=True
    )
    async with smarthost_sink(cfg) as sink:
        entries = f"{sink.nexthop} relayuser:{PASSWORD}\n"
        settings = _settings(
            tmp_path,
            entries,
            tls_security_level="none",
            sasl_security_options=("noplaintext", "noanonymous"),
        )
        agent = SmtpAgent(settings)
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert [(a.mechanism, a.login, a.password, a.tls, a.ok) for a in sink.auth_attempts] == [
        ("CRAM-MD5", "relayuser", "", False, True)
    ]
