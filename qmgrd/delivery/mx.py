"""MX/address lookup for the SMTP agent (notes §10.3).

Nexthop syntax (``parse_nexthop``, ``Destination``, ``Endpoint``) lives in
``nexthop`` and is re-exported here.

``MxResolver.lookup(dest)`` returns either the ordered list of ``Endpoint``s
to try or a ``DnsFailure`` (a value, never an exception, per STYLE §6):

- MX records sorted by preference; with ``randomize`` the addresses are
  shuffled first and then stably sorted, so equal-preference *addresses* end
  up in random order (as Postfix's smtp_addr.c does);
- null MX (one record ``0 .``, RFC 7505): permanent 5.1.0;
- NXDOMAIN: permanent 5.4.4; SERVFAIL, timeout or no usable resolver:
  transient 4.4.3; no MX records: the name's own A/AAAA;
- MX hosts whose addresses cannot be found are skipped; if none has an
  address, the error is transient if any lookup was transient, else 5.4.4
  (4.4.4 with ``smtp_defer_if_no_mx_address_found``);
- a failed MX lookup (SERVFAIL, timeout) defers, unless
  ``ignore_mx_lookup_error``: then the name's own addresses are used;
- ordering (``order_endpoints``): shuffled within a preference, then sorted by
  preference and, at equal preference, by ``smtp_address_preference``
  (``ipv4`` / ``ipv6`` first; ``any`` keeps the shuffle); with
  ``smtp_balance_inet_protocols`` a list of both families that is longer than
  ``smtp_mx_address_limit`` keeps addresses of both within the limit;
- hostile answers stay cheap: hosts are resolved best preference first
  (shuffled within a preference when randomizing) and only until
  ``address_limit`` addresses (``smtp_mx_address_limit``) are known, and never
  more than ``MX_HOST_LIMIT`` hosts, so 2000 MX records cost a few queries,
  not 4000. A CNAME loop ends as dnspython's NoAnswer/error for that name.

Nameservers come from ``smtp_dns_nameservers`` (``host``, ``host:port`` or
``[host]:port``); empty means the system resolver.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.nameserver
import dns.rdatatype
import dns.resolver

from qmgrd.delivery.nexthop import (
    DEFAULT_PORT,
    Destination,
    Endpoint,
    parse_destination,
    parse_nexthop,
)
from qmgrd.errors import ConfigError

__all__ = [
    "DEFAULT_PORT",
    "Destination",
    "DnsFailure",
    "Endpoint",
    "EndpointUsage",
    "MxResolver",
    "order_endpoints",
    "parse_destination",
    "parse_nameserver",
    "parse_nexthop",
]

MX_HOST_LIMIT = 50  # MX hosts whose addresses one lookup may resolve, whatever the answer holds
LITERAL_CACHE_LIMIT = 4096  # destinations remembered as "an address" or "a name" per resolver


@dataclass(frozen=True, slots=True)
class DnsFailure:
    """A lookup that produced no address: transient (4.x.x) or permanent (5.x.x)."""

    dsn: str
    reason: str

    @property
    def transient(self) -> bool:
        """Whether the recipients should be deferred rather than bounced."""
        return self.dsn.startswith("4")


def parse_nameserver(text: str) -> dns.nameserver.Do53Nameserver:
    """Parse one ``smtp_dns_nameservers`` entry: ``host``, ``host:port`` or ``[host]:port``."""
    item = text.strip()
    port = 53
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ConfigError(f"smtp_dns_nameservers: bad entry {text!r}")
        host, rest = item[1:close], item[close + 1 :]
        if rest:
            if not rest.startswith(":") or not rest[1:].isdigit():
                raise ConfigError(f"smtp_dns_nameservers: bad entry {text!r}")
            port = int(rest[1:])
    elif item.count(":") == 1:
        host, port_text = item.split(":")
        if not port_text.isdigit():
            raise ConfigError(f"smtp_dns_nameservers: bad port in {text!r}")
        port = int(port_text)
    else:
        host = item  # a bare IPv4 or IPv6 address
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"smtp_dns_nameservers: {host!r} is not an IP address") from None
    return dns.nameserver.Do53Nameserver(host, port)


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class MxResolver:
    """MX and address lookups with dnspython's async resolver (one per SMTP agent)."""

    def __init__(
        self,
        nameservers: tuple[str, ...] = (),
        timeout: float = 10.0,
        rng: random.Random | None = None,
        randomize: bool = True,
        address_limit: int = 0,
        *,
        address_preference: str = "any",
        balance_inet_protocols: bool = True,
        ignore_mx_lookup_error: bool = False,
        defer_if_no_mx_address_found: bool = False,
    ) -> None:
        """Build the resolver; an empty ``nameservers`` uses the system configuration.

        ``address_limit`` (0 = none) stops resolving MX hosts once that many
        addresses are known: the agent would not try more anyway.
        """
        self._rng = rng or random.Random()
        self._randomize = randomize
        self._address_limit = address_limit
        self._preference = address_preference
        self._balance = balance_inet_protocols
        self._ignore_mx_error = ignore_mx_lookup_error
        self._defer_no_address = defer_if_no_mx_address_found
        self._setup_error: str | None = None
        if nameservers:
            self._resolver = dns.asyncresolver.Resolver(configure=False)
            self._resolver.nameservers = [parse_nameserver(ns) for ns in nameservers]
        else:
            try:
                self._resolver = dns.asyncresolver.Resolver()
            except dns.resolver.NoResolverConfiguration as exc:
                self._resolver = dns.asyncresolver.Resolver(configure=False)
                self._setup_error = f"no resolver configuration: {exc}"
        self._resolver.lifetime = timeout
        self._resolver.timeout = timeout
        # Answers are cached for their TTL: a busy destination is looked up once per TTL,
        # not once per delivery.
        self._resolver.cache = dns.resolver.LRUCache(4096)
        # A destination that is an address resolves to itself: parsed once, not per delivery.
        self._literal: dict[Destination, Endpoint | None] = {}

    async def lookup(self, dest: Destination) -> list[Endpoint] | DnsFailure:
        """Resolve one destination to the addresses to try, best first."""
        if dest not in self._literal:
            if len(self._literal) >= LITERAL_CACHE_LIMIT:
                self._literal.clear()
            address = _is_address(dest.host)
            self._literal[dest] = Endpoint(dest.host, dest.host, dest.port) if address else None
        literal = self._literal[dest]
        if literal is not None:
            return [literal]
        if self._setup_error is not None:
            return DnsFailure("4.4.3", self._setup_error)
        if not dest.mx:
            found = await self._addresses(dest.host)
            if isinstance(found, DnsFailure):
                return found
            return self._order([Endpoint(dest.host, a, dest.port) for a in found])
        return await self._mx(dest)

    async def _mx(self, dest: Destination) -> list[Endpoint] | DnsFailure:
        name = dest.host
        try:
            answer = await self._resolver.resolve(name, "MX", search=False)
        except dns.resolver.NXDOMAIN:
            return DnsFailure(
                "5.4.4",
                f"Host or domain name not found. Name service error for name={name} "
                "type=MX: Host not found",
            )
        except dns.resolver.NoAnswer:
            found = await self._addresses(name)
            if isinstance(found, DnsFailure):
                return found
            return self._order([Endpoint(name, a, dest.port) for a in found])
        except (dns.exception.DNSException, OSError) as exc:
            if not self._ignore_mx_error:
                return _temp_failure(name, "MX", exc)
            found = await self._addresses(name)
            if isinstance(found, DnsFailure):
                return found
            return self._order([Endpoint(name, a, dest.port) for a in found])
        records = [(int(r.preference), r.exchange.to_text(omit_final_dot=True)) for r in answer]
        if any(host in ("", ".") for _, host in records):
            return DnsFailure("5.1.0", f"Domain {name} does not accept mail (nullMX)")
        if self._randomize:
            self._rng.shuffle(records)  # then a stable sort: random within a preference
        records.sort(key=lambda rec: rec[0])
        endpoints: list[Endpoint] = []
        failures: list[DnsFailure] = []
        for pref, host in records[:MX_HOST_LIMIT]:
            if self._address_limit and len(endpoints) >= self._address_limit:
                break
            if _is_address(host):  # not allowed by RFC 5321 but seen in the wild
                endpoints.append(Endpoint(host, host, dest.port, pref))
                continue
            found = await self._addresses(host)
            if isinstance(found, DnsFailure):
                failures.append(found)
                continue
            endpoints.extend(Endpoint(host, a, dest.port, pref) for a in found)
        if endpoints:
            return self._order(endpoints)
        for failure in failures:
            if failure.transient:
                return failure
        failure = (
            failures[0]
            if failures
            else DnsFailure("5.4.4", f"no MX host for {name} has an address")
        )
        if self._defer_no_address:
            return DnsFailure("4.4.4", failure.reason)
        return failure

    async def _addresses(self, host: str) -> list[str] | DnsFailure:
        """A and AAAA records of ``host``; a failure only when neither gave an address."""
        addrs: list[str] = []
        failure: DnsFailure | None = None
        for rdtype in ("A", "AAAA"):
            try:
                answer = await self._resolver.resolve(host, rdtype, search=False)
            except dns.resolver.NXDOMAIN:
                failure = failure or DnsFailure(
                    "5.4.4",
                    f"Host or domain name not found. Name service error for name={host} "
                    f"type={rdtype}: Host not found",
                )
                break  # the name does not exist: AAAA would say the same
            except dns.resolver.NoAnswer:
                continue
            except (dns.exception.DNSException, OSError) as exc:
                temp = _temp_failure(host, rdtype, exc)
                if failure is None or not failure.transient:
                    failure = temp
                continue
            addrs.extend(r.to_text() for r in answer)
        if addrs:
            return addrs
        if failure is not None:
            return failure
        return DnsFailure(
            "5.4.4",
            f"Host or domain name not found. Name service error for name={host} type=A: "
            "No address associated with hostname",
        )

    def _order(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Shuffle (if configured), then order as ``order_endpoints`` does (notes §10.3)."""
        if self._randomize and len(endpoints) > 1:
            self._rng.shuffle(endpoints)
        return order_endpoints(
            endpoints,
            preference=self._preference,
            balance=self._balance,
            limit=self._address_limit,
        )


def _is_v6(ep: Endpoint) -> bool:
    return ":" in ep.addr


def _family_rank(ep: Endpoint, preference: str) -> int:
    if preference == "ipv4":
        return 1 if _is_v6(ep) else 0
    if preference == "ipv6":
        return 0 if _is_v6(ep) else 1
    return 0


class EndpointUsage:
    """When each address was last connected to (fanf's load spreading; bounded, LRU).

    ``spread(endpoints)`` reorders addresses of equal MX preference (and equal rank under
    ``smtp_address_preference``) least recently used first, never-used ones first of all;
    ties keep the list's (shuffled) order. Over a run of deliveries this spreads one node's
    sessions round-robin over a destination's equal MX hosts instead of piling onto one
    (fanf: "pick the oldest" closed destination, a random unused one before that). The
    SMTP agent puts addresses with a live cached session before these.
    """

    def __init__(self, preference: str = "any", limit: int = 4096) -> None:
        """``limit``: addresses remembered (the least recently used is forgotten first)."""
        self.preference = preference
        self.limit = limit
        self._used: dict[tuple[str, int], float] = {}

    def used(self, ep: Endpoint, now: float) -> None:
        """A session to ``ep`` was opened or reused at ``now``."""
        key = (ep.addr, ep.port)
        self._used.pop(key, None)
        self._used[key] = now
        if len(self._used) > self.limit:
            del self._used[next(iter(self._used))]

    def last(self, ep: Endpoint) -> float:
        """When ``ep`` was last used (``-inf``: never, or forgotten)."""
        return self._used.get((ep.addr, ep.port), float("-inf"))

    def spread(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Least recently used first within each preference (see the class doc)."""
        return sorted(
            endpoints,
            key=lambda ep: (ep.pref, _family_rank(ep, self.preference), self.last(ep)),
        )


def order_endpoints(
    endpoints: list[Endpoint], *, preference: str = "any", balance: bool = True, limit: int = 0
) -> list[Endpoint]:
    """Stable-sort by MX preference and address family, then balance the families.

    ``preference`` ``ipv4`` / ``ipv6`` puts that family first among addresses of
    equal MX preference. With ``balance`` and a list of both families longer
    than ``limit`` (> 0), each family keeps at least half the limit (or all it
    has, if fewer), in list order, so the client can try both before it runs
    into ``smtp_mx_address_limit`` (Postfix smtp_balance_inet_proto).
    """

    ordered = sorted(endpoints, key=lambda ep: (ep.pref, _family_rank(ep, preference)))
    v6 = sum(1 for ep in ordered if _is_v6(ep))
    v4 = len(ordered) - v6
    if not balance or limit <= 0 or len(ordered) <= limit or v4 == 0 or v6 == 0:
        return ordered
    v4_target = min(v4, max(limit - v6, limit // 2))
    v6_target = min(v6, limit - v4_target)
    v4_target = limit - v6_target
    kept: list[Endpoint] = []
    counts = {False: 0, True: 0}
    targets = {False: v4_target, True: v6_target}
    for ep in ordered:
        family = _is_v6(ep)
        if counts[family] < targets[family]:
            counts[family] += 1
            kept.append(ep)
    return kept


def _temp_failure(name: str, rdtype: str, exc: BaseException) -> DnsFailure:
    detail = "timeout" if isinstance(exc, dns.exception.Timeout) else type(exc).__name__
    return DnsFailure(
        "4.4.3",
        f"Host or domain name not found. Name service error for name={name} type={rdtype}: "
        f"Host not found, try again ({detail})",
    )
