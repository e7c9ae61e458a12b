"""A whole daemon relaying through a smarthost: AUTH, fallback relay, unsendable addresses.

The main.cf lines are the ones an operator copies from Postfix guides (issue 11).
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import pytest
import trustme
from structlog.testing import capture_logs

from tests.integration.e2e import running_daemon, status_events, write_config
from tests.integration.sinks import SinkConfig, smtp_sink
from tests.integration.smarthost_sinks import SmarthostConfig, smarthost_sink

PASSWORD = "Tr0ub4dor&3-e2e"


@pytest.fixture(scope="module")
def server_tls() -> ssl.SSLContext:
    """A server context with a certificate for 127.0.0.1 from a throwaway CA."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("127.0.0.1").configure_cert(ctx)
    return ctx


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _smarthost_conf(tmp_path: Path, nexthop: str, secret: str) -> Path:
    (tmp_path / "etc").mkdir(parents=True, exist_ok=True)
    passwd = tmp_path / "etc" / "sasl_passwd"
    passwd.write_text(f"{nexthop} relayuser:{secret}\n")
    passwd.chmod(0o600)
    return write_config(
        tmp_path,
        main=(
            f"relayhost = {nexthop}\n"
            "smtp_sasl_auth_enable = yes\n"
            "smtp_sasl_password_maps = texthash:sasl_passwd\n"
            "smtp_sasl_security_options = noanonymous\n"
            "smtp_tls_security_level = encrypt\n"
        ),
    )


async def test_issue_config_delivers_through_authenticated_smarthost(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """The issue's main.cf delivers through a STARTTLS+AUTH smarthost; no password is logged."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        conf = _smarthost_conf(tmp_path, sink.nexthop, PASSWORD)
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                await d.submit("s@src.test", ["r@dst.test"])
                await d.wait_idle()
                assert d.queue_ids("deferred") == []
    assert [m.rcpt_tos for m in sink.messages] == [["r@dst.test"]]
    assert [(a.login, a.tls, a.ok) for a in sink.auth_attempts] == [("relayuser", True, True)]
    assert PASSWORD not in repr(logs)


async def test_wrong_credentials_defer_with_the_535_reply(
    tmp_path: Path, server_tls: ssl.SSLContext
) -> None:
    """Wrong credentials: the message waits in deferred/ with the 535 reply, never bounced."""
    cfg = SmarthostConfig(SinkConfig(tls_context=server_tls), users={"relayuser": PASSWORD})
    async with smarthost_sink(cfg) as sink:
        conf = _smarthost_conf(tmp_path, sink.nexthop, "not-" + PASSWORD)
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                qid = await d.submit("s@src.test", ["r@dst.test"])
                await d.wait_idle()
                assert d.queue_ids("deferred") == [qid]
                reasons = d.spool.read_reasons("defer", qid)
    assert [r.dsn for r in reasons] == ["4.7.8"]
    assert "SASL authentication failed" in reasons[0].reason and "535" in reasons[0].reason
    assert status_events(logs, "bounced") == [] and not sink.messages
    assert PASSWORD not in repr(logs) and PASSWORD not in repr(reasons)


async def test_fallback_relay_then_primary_again(tmp_path: Path) -> None:
    """Primary relayhost down: mail goes to smtp_fallback_relay; primary back: new mail to it."""
    port = _dead_port()
    async with smtp_sink() as fallback:
        conf = write_config(
            tmp_path,
            main=f"relayhost = [127.0.0.1]:{port}\nfallback_relay = {fallback.nexthop}\n",
        )
        async with running_daemon(conf) as d:
            await d.submit("s@src.test", ["first@dst.test"])
            await d.wait_idle()
            async with smtp_sink(port=port) as primary:
                await d.submit("s@src.test", ["second@dst.test"])
                await d.wait_idle()
            assert d.queue_ids("deferred") == []
    assert [m.rcpt_tos for m in fallback.messages] == [["first@dst.test"]]
    assert [m.rcpt_tos for m in primary.messages] == [["second@dst.test"]]


async def test_unsendable_senders_bounce_and_never_kill_the_destination(tmp_path: Path) -> None:
    """Five messages from a sender with an escaped control character, then five good ones:
    the bad ones bounce (5.1.7), every good one is delivered at once, nothing is deferred."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        with capture_logs() as logs:
            async with running_daemon(conf) as d:
                bad = [d.enqueue('"a\x1bb"@example.test', [f"bad{i}@dst.test"]) for i in range(5)]
                await d.wait_idle()
                good = [d.enqueue("s@src.test", [f"good{i}@dst.test"]) for i in range(5)]
                await d.wait_idle()
                assert d.queue_ids("deferred") == []
    delivered = sorted(r for m in sink.messages for r in m.rcpt_tos if r.startswith("good"))
    assert delivered == [f"good{i}@dst.test" for i in range(5)]
    bounced = [e for e in status_events(logs, "bounced") if str(e.get("to", "")).startswith("<bad")]
    assert len(bounced) == 5 and {e.get("dsn") for e in bounced} == {"5.1.7"}
    assert status_events(logs, "deferred") == []
    assert len(bad) == len(good) == 5


async def test_address_with_space_is_relayed_unchanged(tmp_path: Path) -> None:
    """A quoted local part with a space goes out exactly as it came in."""
    async with smtp_sink() as sink:
        conf = write_config(tmp_path, main=f"relayhost = {sink.nexthop}\n")
        async with running_daemon(conf) as d:
            d.enqueue('"sp ace"@src.test', ['"sp ace"@dst.test'])
            await d.wait_idle()
    assert sink.messages[0].mail_from == '"sp ace"@src.test'
    assert sink.messages[0].rcpt_tos == ['"sp ace"@dst.test']
