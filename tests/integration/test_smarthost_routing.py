"""Smarthost routing in the SMTP agent: fallback relays, relayhost lists, bind address, HELO,
and the MX ordering and error parameters."""

from __future__ import annotations

import socket
from pathlib import Path

import dns.message
import dns.rcode
import dns.rdatatype

from qmgrd.config import load_config
from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.mx import Destination, DnsFailure, Endpoint, MxResolver, order_endpoints
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.dnsserver import DnsResponder, dns_responder
from tests.integration.sinks import make_request, smtp_sink
from tests.integration.smarthost_sinks import SmarthostConfig, smarthost_sink


def _settings(**kwargs: object) -> SmtpSettings:
    return SmtpSettings(
        helo_name="client.test",
        connect_timeout=5,
        helo_timeout=5,
        **kwargs,  # type: ignore[arg-type]
    )


def _dead_port() -> int:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


class _Resolver:
    """An MX resolver stand-in: "missing.test" does not exist, addresses resolve to themselves."""

    async def lookup(self, dest: Destination) -> list[Endpoint] | DnsFailure:
        if dest.host == "missing.test":
            return DnsFailure("5.4.4", "Host or domain name not found (missing.test)")
        return [Endpoint(dest.host, dest.host, dest.port)]


async def test_fallback_relay_when_primary_down_and_primary_again_when_back() -> None:
    """Primary down: the fallback relay gets the mail; primary back: new mail goes to it."""
    port = _dead_port()
    primary = f"[127.0.0.1]:{port}"
    async with smtp_sink() as fallback:
        agent = SmtpAgent(_settings(fallback_relay=(fallback.nexthop,)))
        first = await agent.deliver(make_request(primary, ["a@x.test"]))
        async with smtp_sink(port=port) as back:
            second = await agent.deliver(make_request(primary, ["b@x.test"]))
        await agent.close()
    assert first.recipients[0].outcome is Outcome.SENT and first.hop is None
    assert first.recipients[0].relay == f"127.0.0.1[127.0.0.1]:{fallback.port}"
    assert second.recipients[0].outcome is Outcome.SENT
    assert [m.rcpt_tos for m in fallback.messages] == [["a@x.test"]]
    assert [m.rcpt_tos for m in back.messages] == [["b@x.test"]]


async def test_fallback_relay_used_for_a_destination_not_found() -> None:
    """A primary that does not exist falls back instead of bouncing (as Postfix)."""
    async with smtp_sink() as fallback:
        agent = SmtpAgent(_settings(fallback_relay=(fallback.nexthop,)), resolver=_Resolver())  # type: ignore[arg-type]
        result = await agent.deliver(make_request("missing.test", ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert len(fallback.messages) == 1


async def test_everything_down_defers_with_the_last_error_and_hop() -> None:
    """Primary and fallback both down: deferred (never bounced) with a hop status."""
    agent = SmtpAgent(_settings(fallback_relay=(f"[127.0.0.1]:{_dead_port()}",)))
    result = await agent.deliver(make_request(f"[127.0.0.1]:{_dead_port()}", ["a@x.test"]))
    await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.4.1")
    assert result.hop is not None


async def test_relayhost_list_tries_hosts_in_order() -> None:
    """A relayhost list is tried in order: the first host down, the second one delivers."""
    async with smtp_sink() as second:
        agent = SmtpAgent(_settings())
        nexthop = f"[127.0.0.1]:{_dead_port()}, {second.nexthop}"
        result = await agent.deliver(make_request(nexthop, ["a@x.test"]))
        await agent.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert len(second.messages) == 1


async def test_bind_address_is_the_source_address() -> None:
    """smtp_bind_address makes connections come from that local address."""
    async with smarthost_sink(SmarthostConfig(auth_required=False)) as sink:
        agent = SmtpAgent(_settings(bind_address="127.0.0.2"))
        result = await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
        plain = SmtpAgent(_settings())
        await plain.deliver(make_request(sink.nexthop, ["a@x.test"]))
        await agent.close()
        await plain.close()
    assert result.recipients[0].outcome is Outcome.SENT
    assert sink.peers == ["127.0.0.2", "127.0.0.1"]


async def test_helo_name_per_transport_from_master_cf(tmp_path: Path) -> None:
    """A master.cf -o smtp_helo_name override is the EHLO name of that transport only."""
    (tmp_path / "main.cf").write_text(
        f"queue_directory = {tmp_path / 'spool'}\nsmtp_helo_name = main.test\n"
    )
    (tmp_path / "master.cf").write_text(
        "smtp unix - - n - - smtp\nrelay unix - - n - - smtp -o smtp_helo_name=relay.test\n"
    )
    cfg = load_config(tmp_path, hostname="mx.test")
    async with smarthost_sink(SmarthostConfig(auth_required=False)) as sink:
        for transport in ("smtp", "relay"):
            agent = SmtpAgent(SmtpSettings.from_transport(cfg.transport(transport)))
            await agent.deliver(make_request(sink.nexthop, ["a@x.test"]))
            await agent.close()
    assert sink.helo_names == ["main.test", "relay.test"]


def test_address_preference_orders_families_within_a_preference() -> None:
    """smtp_address_preference puts the preferred family first at equal MX preference only."""
    eps = [
        Endpoint("a", "2001:db8::1", 25, 10),
        Endpoint("b", "192.0.2.1", 25, 10),
        Endpoint("c", "2001:db8::2", 25, 20),
        Endpoint("d", "192.0.2.2", 25, 20),
    ]
    v4 = order_endpoints(list(eps), preference="ipv4")
    v6 = order_endpoints(list(eps), preference="ipv6")
    anyf = order_endpoints(list(eps), preference="any")
    assert [e.host for e in v4] == ["b", "a", "d", "c"]
    assert [e.host for e in v6] == ["a", "b", "c", "d"]
    assert [e.host for e in anyf] == ["a", "b", "c", "d"]


def test_balance_inet_protocols_keeps_both_families_within_the_limit() -> None:
    """With balancing, a limit of 2 over 3 IPv6 + 1 IPv4 keeps one of each; without, 2 IPv6."""
    eps = [Endpoint(f"h{i}", f"2001:db8::{i}", 25, 10) for i in range(1, 4)]
    eps.append(Endpoint("v4", "192.0.2.9", 25, 10))
    balanced = order_endpoints(list(eps), balance=True, limit=2)
    plain = order_endpoints(list(eps), balance=False, limit=2)
    assert [e.addr for e in balanced] == ["2001:db8::1", "192.0.2.9"]
    assert [e.addr for e in plain][:2] == ["2001:db8::1", "2001:db8::2"]


RECORDS = {
    ("flaky.test", "A"): ["127.0.0.3"],
    ("flaky.test", "MX"): ["10 mx.flaky.test."],
    ("dangling.test", "MX"): ["10 nowhere.dangling.test."],
    ("dangling.test", "TXT"): ['"exists"'],
}


def _servfail_mx(responder: DnsResponder, name: str) -> None:
    """Make MX queries for ``name`` fail with SERVFAIL while its A records still answer."""
    original = responder.answer

    def answer(query: dns.message.Message) -> dns.message.Message | None:
        question = query.question[0] if query.question else None
        if (
            question is not None
            and question.name.to_text().rstrip(".") == name
            and question.rdtype == dns.rdatatype.MX
        ):
            response = dns.message.make_response(query)
            response.set_rcode(dns.rcode.SERVFAIL)
            return response
        return original(query)

    responder.answer = answer  # type: ignore[method-assign]


async def test_ignore_mx_lookup_error_uses_the_a_record() -> None:
    """A failed MX lookup defers by default; with ignore_mx_lookup_error the A record is used."""
    async with dns_responder(RECORDS) as dns_server:
        _servfail_mx(dns_server, "flaky.test")
        strict = MxResolver((dns_server.nameserver,), timeout=1)
        lenient = MxResolver((dns_server.nameserver,), timeout=1, ignore_mx_lookup_error=True)
        deferred = await strict.lookup(Destination("flaky.test", 25, mx=True))
        found = await lenient.lookup(Destination("flaky.test", 25, mx=True))
    assert isinstance(deferred, DnsFailure) and deferred.dsn == "4.4.3"
    assert found == [Endpoint("flaky.test", "127.0.0.3", 25, 0)]


async def test_defer_if_no_mx_address_found() -> None:
    """MX hosts without addresses bounce (5.4.4) by default and defer (4.4.4) when configured."""
    async with dns_responder(RECORDS) as dns_server:
        bounce = MxResolver((dns_server.nameserver,), timeout=1)
        defer = MxResolver((dns_server.nameserver,), timeout=1, defer_if_no_mx_address_found=True)
        hard = await bounce.lookup(Destination("dangling.test", 25, mx=True))
        soft = await defer.lookup(Destination("dangling.test", 25, mx=True))
    assert isinstance(hard, DnsFailure) and hard.dsn == "5.4.4"
    assert isinstance(soft, DnsFailure) and soft.dsn == "4.4.4" and soft.transient


async def test_bind_address6_is_used_for_ipv6_only() -> None:
    """smtp_bind_address6 applies to IPv6 connections (an address not on this host fails at
    bind, before any packet is sent), and smtp_bind_address never does."""
    settings = _settings(bind_address="127.0.0.1", bind_address6="2001:db8::7")
    agent = SmtpAgent(settings)
    result = await agent.deliver(make_request(f"[::1]:{_dead_port()}", ["a@x.test"]))
    await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.4.1")
    assert "from 2001:db8::7" in rcpt.reply or "Address family not supported" in rcpt.reply
