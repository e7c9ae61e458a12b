"""Local agents, the agent factory, settings, nexthop parsing and reply codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.delivery.agent import DeliveryRequest, Outcome, Recipient
from qmgrd.delivery.content import BytesContent
from qmgrd.delivery.factory import create_agent
from qmgrd.delivery.mx import (
    Destination,
    Endpoint,
    parse_destination,
    parse_nameserver,
    parse_nexthop,
)
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.simple import DiscardAgent, ErrorAgent, RetryAgent, split_reason
from qmgrd.delivery.smtp import SmtpAgent, reply_dsn, xtext
from qmgrd.errors import ConfigError


def _request(nexthop: str, count: int = 2) -> DeliveryRequest:
    return DeliveryRequest(
        queue_id="Q1",
        transport="t",
        nexthop=nexthop,
        sender="s@x",
        recipients=tuple(Recipient(f"r{i}@x", i) for i in range(count)),
        content=BytesContent(b"Subject: x\r\n\r\nbody\r\n"),
    )


async def test_discard_marks_sent() -> None:
    """discard reports every recipient sent with dsn 2.0.0 and the reason."""
    result = await DiscardAgent().deliver(_request("spam filter"))
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.SENT, "2.0.0")}
    assert result.recipients[0].reply == "discarded: spam filter"
    assert result.hop is None


async def test_error_bounces_with_nexthop_text() -> None:
    """error bounces every recipient with the code and reason from the nexthop."""
    result = await ErrorAgent().deliver(_request("5.1.1 mailbox unavailable"))
    assert {(r.outcome, r.dsn, r.reply) for r in result.recipients} == {
        (Outcome.BOUNCED, "5.1.1", "mailbox unavailable")
    }
    assert result.hop is None


async def test_error_with_4xx_code_or_soft_bounce_defers() -> None:
    """error defers for a 4.x.x code, and soft_bounce turns its bounce into a 4.x.x deferral."""
    soft = await ErrorAgent().deliver(_request("4.3.2 try later", 1))
    assert (soft.recipients[0].outcome, soft.recipients[0].dsn) == (Outcome.DEFERRED, "4.3.2")
    softened = await ErrorAgent(soft_bounce=True).deliver(_request("5.1.1 gone", 1))
    assert (softened.recipients[0].outcome, softened.recipients[0].dsn) == (
        Outcome.DEFERRED,
        "4.1.1",
    )


async def test_retry_defers() -> None:
    """retry defers every recipient; a missing code becomes 4.0.0 and a 5.x.x is softened."""
    plain = await RetryAgent().deliver(_request("maintenance", 1))
    assert (plain.recipients[0].outcome, plain.recipients[0].dsn) == (Outcome.DEFERRED, "4.0.0")
    assert plain.recipients[0].reply == "maintenance"
    hard = await RetryAgent().deliver(_request("5.7.1 blocked", 1))
    assert hard.recipients[0].dsn == "4.7.1"


def test_split_reason() -> None:
    """A leading enhanced status code is split from the reason; otherwise the default applies."""
    assert split_reason("5.1.1 user unknown", "5.0.0") == ("5.1.1", "user unknown")
    assert split_reason("user unknown", "5.0.0") == ("5.0.0", "user unknown")
    assert split_reason("5.1.1", "5.0.0") == ("5.1.1", "refused")


async def test_factory_maps_master_commands() -> None:
    """create_agent maps smtp, relay, discard, error and retry; anything else is a ConfigError."""
    assert isinstance(create_agent("smtp"), SmtpAgent)
    assert isinstance(create_agent("relay"), SmtpAgent)
    assert isinstance(create_agent("discard"), DiscardAgent)
    assert isinstance(create_agent("error"), ErrorAgent)
    assert isinstance(create_agent("retry"), RetryAgent)
    with pytest.raises(ConfigError, match="local"):
        create_agent("local")


def test_settings_validate_tls_level() -> None:
    """An unknown smtp_tls_security_level is a ConfigError naming the parameter."""
    with pytest.raises(ConfigError, match="smtp_tls_security_level"):
        SmtpSettings(tls_security_level="dane")


def test_settings_from_config(tmp_path: Path) -> None:
    """SmtpSettings.from_transport reads main.cf and master.cf -o overrides."""
    config = pytest.importorskip("qmgrd.config")
    (tmp_path / "main.cf").write_text(
        "smtp_helo_name = mail.example.org\n"
        "smtp_dns_nameservers = 127.0.0.1:5353\n"
        "smtp_connect_timeout = 7s\n"
        "smtp_mx_address_limit = 3\n"
        "smtp_connection_cache_destinations = example.com\n"
    )
    (tmp_path / "master.cf").write_text(
        "smtp unix - - n - - smtp\n"
        "secure unix - - n - - smtp -o smtp_tls_security_level=encrypt -o soft_bounce=yes\n"
    )
    cfg = config.load_config(tmp_path)
    plain = SmtpSettings.from_transport(cfg.transport("smtp"))
    secure = SmtpSettings.from_transport(cfg.transport("secure"))
    assert plain.helo_name == "mail.example.org"
    assert plain.dns_nameservers == ("127.0.0.1:5353",)
    assert plain.connect_timeout == 7
    assert plain.mx_address_limit == 3
    assert plain.connection_cache_destinations == ("example.com",)
    assert plain.tls_security_level == "none"
    assert (secure.tls_security_level, secure.soft_bounce) == ("encrypt", True)


def test_parse_nexthop() -> None:
    """Nexthop syntax: domain, domain:port, [host], [host]:port, [ipv6], and lists."""
    assert parse_destination("example.com") == Destination("example.com", 25, mx=True)
    assert parse_destination("example.com:2525") == Destination("example.com", 2525, mx=True)
    assert parse_destination("[10.0.0.1]") == Destination("10.0.0.1", 25, mx=False)
    assert parse_destination("[::1]:26") == Destination("::1", 26, mx=False)
    assert parse_destination("[ipv6:::1]") == Destination("::1", 25, mx=False)
    assert parse_destination("[mail.example.com]:smtp").port == 25
    assert len(parse_nexthop("a.example, [b.example]:26 c.example")) == 3
    assert parse_destination("[b.example]:26").label == "[b.example]:26"
    for bad in ("", "[x", "[x]y", "x:99999", "x:nosuchservice"):
        with pytest.raises(ConfigError):
            parse_nexthop(bad)


def test_parse_nameserver() -> None:
    """smtp_dns_nameservers entries: address, address:port, [address]:port; names refused."""
    assert (parse_nameserver("127.0.0.1").address, parse_nameserver("127.0.0.1").port) == (
        "127.0.0.1",
        53,
    )
    assert parse_nameserver("127.0.0.1:5353").port == 5353
    assert parse_nameserver("[::1]:5353").address == "::1"
    assert parse_nameserver("::1").port == 53
    with pytest.raises(ConfigError):
        parse_nameserver("dns.example")


def test_reply_dsn() -> None:
    """The enhanced code comes from the reply text when its class agrees with the reply code."""
    assert reply_dsn(550, "5.1.1 no such user") == "5.1.1"
    assert reply_dsn(550, "no such user") == "5.0.0"
    assert reply_dsn(450, "5.1.1 mismatched class") == "4.0.0"
    assert reply_dsn(250, "2.0.0 Ok") == "2.0.0"


def test_xtext() -> None:
    """DSN parameter values are xtext-encoded (RFC 3461): '+', '=' and controls become +HH."""
    assert xtext("a+b=c d") == "a+2Bb+3Dc+20d"


def test_dsn_param_keeps_stored_xtext_and_encodes_raw_text() -> None:
    """ENVID/ORCPT stored as received xtext go out unchanged; raw text is xtext-encoded once."""
    from qmgrd.delivery.smtp import dsn_param

    assert dsn_param("Ab+2Bc") == "Ab+2Bc"
    assert dsn_param("a@example.com") == "a@example.com"
    assert dsn_param("a+b=c d") == "a+2Bb+3Dc+20d"


async def test_bad_nexthop_defers_each_time_with_its_reason() -> None:
    """An unusable nexthop defers every recipient with 4.3.5 and the reason, every time
    (its parse is remembered per agent, the outcome is the same), never a hop failure."""
    agent = SmtpAgent(SmtpSettings())
    for _ in range(2):
        result = await agent.deliver(_request("[unbalanced"))
        assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.DEFERRED, "4.3.5")}
        assert result.recipients[0].reply == "bad nexthop: unbalanced '[' in nexthop '[unbalanced'"
        assert result.hop is None
    await agent.close()


async def test_an_address_destination_resolves_to_itself_every_time() -> None:
    """A literal address is its own endpoint (no DNS), the same on every lookup."""
    resolver = SmtpAgent(SmtpSettings()).resolver
    for dest in (Destination("127.0.0.1", 2525, mx=False), Destination("::1", 25, mx=True)):
        first = await resolver.lookup(dest)
        assert first == await resolver.lookup(dest) == [Endpoint(dest.host, dest.host, dest.port)]
