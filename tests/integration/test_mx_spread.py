"""fanf's load spreading over equal-preference MX hosts (``mx.EndpointUsage``)."""

from __future__ import annotations

import random

from qmgrd.delivery.agent import Outcome
from qmgrd.delivery.mx import Endpoint, EndpointUsage
from qmgrd.delivery.smtp import SmtpAgent
from tests.integration.dnsserver import dns_responder
from tests.integration.sinks import make_request, smtp_sink
from tests.integration.test_dns_mx import RECORDS, _settings


def test_least_recently_used_first_within_a_preference() -> None:
    """Never-used addresses first, then the oldest; preferences and family rank stay in order."""
    a = Endpoint("a", "127.0.0.11", 25, 10)
    b = Endpoint("b", "127.0.0.12", 25, 10)
    c = Endpoint("c", "127.0.0.13", 25, 20)
    v6 = Endpoint("d", "::1", 25, 10)
    usage = EndpointUsage("ipv4")
    assert usage.spread([a, b, c]) == [a, b, c]
    usage.used(a, 1.0)
    assert usage.spread([a, b, c]) == [b, a, c]
    usage.used(b, 2.0)
    assert usage.spread([b, a, c]) == [a, b, c]
    usage.used(c, 0.5)
    assert usage.spread([v6, c, b, a]) == [a, b, v6, c]  # IPv4 first, then recency


def test_memory_is_bounded() -> None:
    """Beyond ``limit`` addresses the least recently used is forgotten."""
    usage = EndpointUsage(limit=2)
    eps = [Endpoint(f"h{i}", f"127.0.0.{i + 1}", 25) for i in range(3)]
    for i, ep in enumerate(eps):
        usage.used(ep, float(i))
    assert usage.last(eps[0]) == float("-inf") and usage.last(eps[2]) == 2.0


async def test_deliveries_alternate_over_equal_mx_hosts() -> None:
    """Six deliveries to a domain with two equal MX hosts (no connection cache): three each,
    whatever the shuffle (a shuffle alone can send them all to one host)."""
    async with (
        smtp_sink(host="127.0.0.11") as first,
        smtp_sink(host="127.0.0.12", port=first.port) as second,
        dns_responder(RECORDS) as dns,
    ):
        agent = SmtpAgent(_settings(dns.nameserver), rng=random.Random(3))
        for i in range(6):
            result = await agent.deliver(
                make_request(f"equal.test:{first.port}", [f"r{i}@equal.test"])
            )
            assert result.recipients[0].outcome is Outcome.SENT
        await agent.close()
    assert (len(first.messages), len(second.messages)) == (3, 3)
