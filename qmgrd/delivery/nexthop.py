"""Nexthop syntax for the SMTP agent (Postfix smtp(8) destinations; notes §10.3).

``parse_nexthop`` reads Postfix smtp(8) nexthop syntax: ``domain``,
``domain:port``, ``[host]``, ``[host]:port`` (brackets = no MX lookup), and a
list of those separated by commas or spaces (tried in order); a bad one is a
ConfigError. ``Destination`` is one parsed destination, ``Endpoint`` one
address to connect to (what ``mx.MxResolver`` returns).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass

from qmgrd.errors import ConfigError

DEFAULT_PORT = 25


@dataclass(frozen=True, slots=True)
class Destination:
    """One nexthop destination: a name (or address), a port, and whether to look up MX."""

    host: str
    port: int
    mx: bool

    @property
    def label(self) -> str:
        """The destination as written in Postfix syntax (the connection-cache nexthop label)."""
        host = self.host if self.mx else f"[{self.host}]"
        return host if self.port == DEFAULT_PORT else f"{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One address to connect to, with the MX host name and preference it came from."""

    host: str
    addr: str
    port: int
    pref: int = 0

    @property
    def relay(self) -> str:
        """``host[addr]:port`` as shown in ``relay=`` log fields and results."""
        return f"{self.host}[{self.addr}]:{self.port}"


def _parse_port(text: str, where: str) -> int:
    if text.isdigit():
        port = int(text)
        if 0 < port < 65536:
            return port
        raise ConfigError(f"bad port in nexthop {where!r}")
    try:
        return socket.getservbyname(text, "tcp")
    except OSError:
        raise ConfigError(f"unknown service {text!r} in nexthop {where!r}") from None


def parse_destination(text: str) -> Destination:
    """Parse one ``domain[:port]`` or ``[host][:port]`` destination."""
    item = text.strip()
    if item.startswith("smtp:"):  # transport_maps style "smtp:[host]" leaking through
        item = item[5:]
    if not item:
        raise ConfigError("empty nexthop")
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ConfigError(f"unbalanced '[' in nexthop {text!r}")
        host = item[1:close]
        rest = item[close + 1 :]
        if rest and not rest.startswith(":"):
            raise ConfigError(f"garbage after ']' in nexthop {text!r}")
        port = _parse_port(rest[1:], text) if rest else DEFAULT_PORT
        if host.lower().startswith("ipv6:"):
            host = host[5:]
        if not host:
            raise ConfigError(f"empty host in nexthop {text!r}")
        return Destination(host, port, mx=False)
    host, sep, port_text = item.rpartition(":")
    if not sep:
        return Destination(item.rstrip("."), DEFAULT_PORT, mx=True)
    if not host:
        raise ConfigError(f"empty host in nexthop {text!r}")
    return Destination(host.rstrip("."), _parse_port(port_text, text), mx=True)


def parse_nexthop(text: str) -> tuple[Destination, ...]:
    """Parse a nexthop that may list several destinations (comma or space separated)."""
    items = [part for part in text.replace(",", " ").split() if part]
    if not items:
        raise ConfigError("empty nexthop")
    return tuple(parse_destination(item) for item in items)
