"""A tiny authoritative DNS responder on 127.0.0.1 (UDP) for integration tests.

Usage::

    records = {("example.test", "MX"): ["10 mx1.example.test.", "20 mx2.example.test."],
               ("mx1.example.test", "A"): ["127.0.0.2"]}
    async with dns_responder(records, failures={"broken.test": "SERVFAIL"}) as dns:
        settings = SmtpSettings(dns_nameservers=(dns.nameserver,))

Names are matched case-insensitively without the trailing dot. A name that
has records of some type but not the one asked gets an empty NOERROR answer
(NoAnswer); a name with no records at all gets NXDOMAIN. ``failures`` maps a
name to ``"SERVFAIL"``, ``"NXDOMAIN"``, ``"REFUSED"`` or ``"timeout"`` (no
answer at all). A null MX is just the record ``"0 ."``. ``queries`` records
every (name, type) asked, so tests can check what was looked up.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import cast

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset


def _norm(name: str) -> str:
    return name.lower().rstrip(".")


class DnsResponder(asyncio.DatagramProtocol):
    """Answers queries from a dict of records; runs on the test's loop."""

    def __init__(
        self,
        records: Mapping[tuple[str, str], Sequence[str]],
        failures: Mapping[str, str] | None = None,
        ttl: int = 60,
    ) -> None:
        self.records = {
            (_norm(name), rtype.upper()): list(v) for (name, rtype), v in records.items()
        }
        self.failures = {_norm(name): kind for name, kind in (failures or {}).items()}
        self.ttl = ttl
        self.queries: list[tuple[str, str]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.host = "127.0.0.1"
        self.port = 0

    @property
    def nameserver(self) -> str:
        """The ``smtp_dns_nameservers`` entry for this responder (``host:port``)."""
        return f"{self.host}:{self.port}"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # create_datagram_endpoint hands its protocol a datagram transport.
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            query = dns.message.from_wire(data)
        except Exception:
            return
        response = self.answer(query)
        if response is not None and self.transport is not None:
            self.transport.sendto(response.to_wire(), addr)

    def answer(self, query: dns.message.Message) -> dns.message.Message | None:
        """The response to one query, or None to stay silent (a timeout)."""
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if not query.question:
            response.set_rcode(dns.rcode.FORMERR)
            return response
        question = query.question[0]
        name = _norm(question.name.to_text())
        rtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rtype))
        failure = self.failures.get(name)
        if failure == "timeout":
            return None
        if failure is not None:
            response.set_rcode(dns.rcode.from_text(failure))
            return response
        values = self.records.get((name, rtype))
        if values:
            rrset = dns.rrset.from_text_list(
                question.name, self.ttl, dns.rdataclass.IN, question.rdtype, values
            )
            response.answer.append(rrset)
        elif not any(key[0] == name for key in self.records):
            response.set_rcode(dns.rcode.NXDOMAIN)
        return response


@contextlib.asynccontextmanager
async def dns_responder(
    records: Mapping[tuple[str, str], Sequence[str]],
    failures: Mapping[str, str] | None = None,
    host: str = "127.0.0.1",
) -> AsyncIterator[DnsResponder]:
    """A running ``DnsResponder`` on ``host`` and an OS-chosen UDP port."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(
        lambda: DnsResponder(records, failures), local_addr=(host, 0)
    )
    protocol.host = host
    protocol.port = transport.get_extra_info("sockname")[1]
    try:
        yield protocol
    finally:
        transport.close()
