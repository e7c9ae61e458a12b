"""MX lookup and fallback against a DNS responder on 127.0.0.1 (never a real DNS server)."""

from __future__ import annotations

import random
from typing import Any

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.mx import Destination, DnsFailure, Endpoint, MxResolver
from qmgrd.delivery.settings import SmtpSettings
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.dnsserver import dns_responder
from tests.integration.sinks import SinkConfig, make_request, smtp_sink

RECORDS = {
    ("example.test", "MX"): ["10 mx1.example.test.", "20 mx2.example.test."],
    ("mx1.example.test", "A"): ["127.0.0.2"],
    ("mx2.example.test", "A"): ["127.0.0.3"],
    ("nomx.test", "A"): ["127.0.0.3"],
    ("null.test", "MX"): ["0 ."],
    ("equal.test", "MX"): ["10 a.equal.test.", "10 b.equal.test.", "20 c.equal.test."],
    ("a.equal.test", "A"): ["127.0.0.11"],
    ("b.equal.test", "A"): ["127.0.0.12"],
    ("c.equal.test", "A"): ["127.0.0.13"],
}
FAILURES = {"servfail.test": "SERVFAIL", "slow.test": "timeout"}


def _settings(nameserver: str, **kwargs: Any) -> SmtpSettings:
    return SmtpSettings(
        helo_name="client.test",
        dns_nameservers=(nameserver,),
        dns_timeout=0.5,
        connect_timeout=5,
        helo_timeout=5,
        **kwargs,
    )


async def test_mx_sorted_by_preference_with_addresses() -> None:
    """MX hosts are expanded to addresses and ordered by preference, keeping the port."""
    async with dns_responder(RECORDS) as dns:
        resolver = MxResolver((dns.nameserver,), timeout=1)
        found = await resolver.lookup(Destination("example.test", 2525, mx=True))
    assert found == [
        Endpoint("mx1.example.test", "127.0.0.2", 2525, 10),
        Endpoint("mx2.example.test", "127.0.0.3", 2525, 20),
    ]


async def test_equal_preference_is_shuffled_but_preference_order_kept() -> None:
    """Equal-preference addresses come out in varying order; worse preferences stay last."""
    async with dns_responder(RECORDS) as dns:
        resolver = MxResolver((dns.nameserver,), timeout=1, rng=random.Random(7))
        orders = set()
        for _ in range(12):
            found = await resolver.lookup(Destination("equal.test", 25, mx=True))
            assert isinstance(found, list)
            assert found[-1].addr == "127.0.0.13"
            orders.add(tuple(ep.addr for ep in found[:2]))
    assert orders == {("127.0.0.11", "127.0.0.12"), ("127.0.0.12", "127.0.0.11")}


async def test_no_mx_falls_back_to_a_record() -> None:
    """A domain without MX records is delivered to its own A record."""
    async with dns_responder(RECORDS) as dns:
        resolver = MxResolver((dns.nameserver,), timeout=1)
        found = await resolver.lookup(Destination("nomx.test", 25, mx=True))
    assert found == [Endpoint("nomx.test", "127.0.0.3", 25, 0)]


async def test_lookup_failures_are_values() -> None:
    """Null MX is 5.1.0, NXDOMAIN 5.4.4, SERVFAIL and timeout 4.4.3: values, not exceptions."""
    async with dns_responder(RECORDS, FAILURES) as dns:
        resolver = MxResolver((dns.nameserver,), timeout=0.3)
        null = await resolver.lookup(Destination("null.test", 25, mx=True))
        nx = await resolver.lookup(Destination("nowhere.test", 25, mx=True))
        servfail = await resolver.lookup(Destination("servfail.test", 25, mx=True))
        timeout = await resolver.lookup(Destination("slow.test", 25, mx=True))
    assert isinstance(null, DnsFailure) and null.dsn == "5.1.0"
    assert isinstance(nx, DnsFailure) and nx.dsn == "5.4.4"
    assert isinstance(servfail, DnsFailure) and servfail.dsn == "4.4.3" and servfail.transient
    assert isinstance(timeout, DnsFailure) and timeout.dsn == "4.4.3"


async def test_best_mx_refuses_next_mx_accepts() -> None:
    """When the best MX refuses connections the message goes to the next MX, without a hop."""
    async with smtp_sink(host="127.0.0.3") as sink, dns_responder(RECORDS) as dns:
        # Nothing listens on 127.0.0.2:<port>, so mx1 refuses the connection.
        agent = SmtpAgent(_settings(dns.nameserver))
        result = await agent.deliver(make_request(f"example.test:{sink.port}", ["a@example.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert rcpt.outcome is Outcome.SENT
    assert rcpt.relay == f"mx2.example.test[127.0.0.3]:{sink.port}"
    assert result.hop is None
    assert len(sink.messages) == 1


async def test_best_mx_soft_rejects_recipient_next_mx_accepts() -> None:
    """A 4xx RCPT reply from a non-final MX keeps the recipient for the next MX; 5xx bounces."""
    primary_cfg = SinkConfig(
        rcpt_replies={"soft@x.test": (450, "4.2.0 greylisted"), "hard@x.test": (550, "5.1.1 no")}
    )
    async with (
        smtp_sink(primary_cfg, host="127.0.0.2") as primary,
        smtp_sink(host="127.0.0.3", port=primary.port) as backup,
        dns_responder(RECORDS) as dns,
    ):
        agent = SmtpAgent(_settings(dns.nameserver))
        result = await agent.deliver(
            make_request(
                f"example.test:{primary.port}", ["ok@x.test", "soft@x.test", "hard@x.test"]
            )
        )
        await agent.close()
    ok, soft, hard = result.recipients
    assert (ok.outcome, soft.outcome, hard.outcome) == (
        Outcome.SENT,
        Outcome.SENT,
        Outcome.BOUNCED,
    )
    assert ok.relay.startswith("mx1.example.test[127.0.0.2]")
    assert soft.relay.startswith("mx2.example.test[127.0.0.3]")
    assert [m.rcpt_tos for m in primary.messages] == [["ok@x.test"]]
    assert [m.rcpt_tos for m in backup.messages] == [["soft@x.test"]]
    assert result.hop is None


async def test_null_mx_bounces_without_hop() -> None:
    """A destination with a null MX bounces every recipient with 5.1.0 and no hop status."""
    async with dns_responder(RECORDS) as dns:
        agent = SmtpAgent(_settings(dns.nameserver))
        result = await agent.deliver(make_request("null.test", ["a@null.test", "b@null.test"]))
        await agent.close()
    assert {(r.outcome, r.dsn) for r in result.recipients} == {(Outcome.BOUNCED, "5.1.0")}
    assert result.hop is None


async def test_nxdomain_bounces() -> None:
    """A destination that does not exist bounces with 5.4.4."""
    async with dns_responder(RECORDS) as dns:
        agent = SmtpAgent(_settings(dns.nameserver))
        result = await agent.deliver(make_request("nowhere.test", ["a@nowhere.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.BOUNCED, "5.4.4")


async def test_servfail_defers_with_hop() -> None:
    """A SERVFAIL on the MX lookup defers with 4.4.3 and reports a hop failure."""
    async with dns_responder(RECORDS, FAILURES) as dns:
        agent = SmtpAgent(_settings(dns.nameserver))
        result = await agent.deliver(make_request("servfail.test", ["a@servfail.test"]))
        await agent.close()
    rcpt = result.recipients[0]
    assert (rcpt.outcome, rcpt.dsn) == (Outcome.DEFERRED, "4.4.3")
    assert "try again" in rcpt.reply
    assert result.hop is not None and result.hop.dsn == "4.4.3"


async def test_mx_address_limit_stops_fallback() -> None:
    """With smtp_mx_address_limit = 1 only the best MX is tried; its refusal defers."""
    async with smtp_sink(host="127.0.0.3") as sink, dns_responder(RECORDS) as dns:
        agent = SmtpAgent(_settings(dns.nameserver, mx_address_limit=1))
        result = await agent.deliver(make_request(f"example.test:{sink.port}", ["a@x.test"]))
        await agent.close()
    assert (result.recipients[0].outcome, result.recipients[0].dsn) == (Outcome.DEFERRED, "4.4.1")
    assert result.hop is not None
    assert sink.connections == 0
