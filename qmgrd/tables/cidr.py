"""``cidr:`` tables (cidr_table(5)): IP address keys matched against networks in order.

Table format (Postfix's): ``pattern result``, ``!pattern result``, ``if pattern`` /
``if !pattern`` ... ``endif`` (nesting allowed), comments, continuation lines,
and the inline form ``cidr:{ { rule }, ... }``. A pattern is ``address`` (exact
match) or ``network/prefix``; IPv6 addresses may be written inside ``[]``. A
network with host bits set (``192.168.1.1/24``) is a `ConfigError` naming the
file and line and the network meant, as Postfix refuses it too.

A key that is not an IP address matches no positive pattern (and every
negated one, as in Postfix, where the comparison simply fails). An IPv4
pattern never matches an IPv6 key and vice versa.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from qmgrd.errors import ConfigError
from qmgrd.tables.base import Watched, read_table_file, table_lines

_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class _Rule:
    kind: str  # "match", "if", "endif"
    network: _Net | None
    negate: bool
    result: str
    skip_to: int


def _parse_network(text: str, where: str) -> _Net:
    address, slash, prefix = text.partition("/")
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ConfigError(f"{where}: bad address pattern {text!r}") from None
    if not slash:
        return ipaddress.ip_network(ip)
    if not prefix.isdigit() or int(prefix) > ip.max_prefixlen:
        raise ConfigError(f"{where}: bad network prefix length in {text!r}")
    try:
        return ipaddress.ip_network(f"{ip}/{prefix}")
    except ValueError:
        meant = ipaddress.ip_network(f"{ip}/{prefix}", strict=False)
        raise ConfigError(
            f"{where}: non-null host address bits in {text!r}, perhaps you should use "
            f"{meant} instead"
        ) from None


def parse_rules(lines: list[tuple[int, str]], where: str) -> tuple[_Rule, ...]:
    """Parse the logical lines of a cidr table."""
    rules: list[_Rule] = []
    open_ifs: list[tuple[int, int]] = []
    for number, line in lines:
        here = f"{where}, line {number}"
        if line == "endif":
            if not open_ifs:
                raise ConfigError(f"{here}: endif without a matching if")
            start, _ = open_ifs.pop()
            old = rules[start]
            rules[start] = _Rule("if", old.network, old.negate, "", len(rules) + 1)
            rules.append(_Rule("endif", None, False, "", 0))
            continue
        words = line.split(None, 1)
        is_if = words[0] == "if"
        if is_if:
            words = words[1].split(None, 1) if len(words) > 1 else []
            if not words:
                raise ConfigError(f"{here}: missing pattern after if")
        pattern = words[0]
        negate = pattern.startswith("!")
        network = _parse_network(pattern[1:] if negate else pattern, here)
        rest = words[1].strip() if len(words) > 1 else ""
        if is_if:
            if rest:
                raise ConfigError(f"{here}: text after the if pattern: {rest!r}")
            open_ifs.append((len(rules), number))
            rules.append(_Rule("if", network, negate, "", 0))
            continue
        if not rest:
            raise ConfigError(f"{here}: missing result after {pattern!r}")
        rules.append(_Rule("match", network, negate, rest, 0))
    if open_ifs:
        raise ConfigError(f"{where}, line {open_ifs[-1][1]}: if without a matching endif")
    return tuple(rules)


def _key_address(key: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if key.startswith("[") and key.endswith("]"):
        key = key[1:-1]
    if key.lower().startswith("ipv6:"):
        key = key[5:]
    try:
        return ipaddress.ip_address(key)
    except ValueError:
        return None


def _evaluate(rules: tuple[_Rule, ...], key: str) -> str | None:
    address = _key_address(key)
    i, n = 0, len(rules)
    while i < n:
        rule = rules[i]
        if rule.kind == "endif":
            i += 1
            continue
        assert rule.network is not None
        inside = (
            address is not None
            and address.version == rule.network.version
            and address in rule.network
        )
        hit = not inside if rule.negate else inside
        if rule.kind == "if":
            i = i + 1 if hit else rule.skip_to
            continue
        if hit:
            return rule.result
        i += 1
    return None


class CidrTable:
    """``cidr:FILE`` or ``cidr:{ { rule }, ... }``."""

    __slots__ = ("_rules", "_watched", "spec")

    def __init__(
        self, spec: str, *, path: Path | None = None, inline: list[str] | None = None
    ) -> None:
        """Parse the rules from ``path`` (re-read when it changes) or ``inline`` rules."""
        self.spec = spec
        self._watched: Watched[tuple[_Rule, ...]] | None = None
        self._rules: tuple[_Rule, ...] = ()
        if path is not None:
            self._watched = Watched(
                path, lambda p: parse_rules(list(table_lines(read_table_file(p), str(p))), str(p))
            )
        else:
            self._rules = parse_rules(list(enumerate(inline or [], start=1)), spec)

    def lookup(self, key: str) -> str | None:
        """The result of the first rule whose network contains the address ``key``."""
        rules = self._watched.current() if self._watched is not None else self._rules
        return _evaluate(rules, key)
