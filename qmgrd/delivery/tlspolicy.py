"""SMTP client TLS policy (Postfix smtp(8) TLS: TLS_README, postconf(5) smtp_tls_*).

Contract
--------
``TlsClient(settings)`` is built once per transport (at start and at each
reload): it checks the CA file/directory and protocol list and builds the SSL
contexts, raising ``ConfigError`` naming the parameter on bad input.
``policy_for(dest)`` gives the ``TlsPolicy`` of one nexthop destination: the
``smtp_tls_policy_maps`` entry for its label (``[host]:port``, ``domain`` as
written) if any, else the transport's ``smtp_tls_security_level``. A policy
entry that cannot be used is a ``Failure`` (4.7.5 "client TLS configuration
problem", as Postfix defers), not an exception. ``check_peer`` decides, after a
completed handshake, whether the certificate satisfies the policy.

Levels (Postfix's): ``none`` (no TLS), ``may`` (opportunistic, no
authentication; fall back to plaintext), ``encrypt`` (mandatory, no
authentication), ``verify`` (mandatory; trusted chain and a name per
``smtp_tls_verify_cert_match``, default ``hostname``), ``secure`` (mandatory;
trusted chain and a name per ``smtp_tls_secure_cert_match``, default
``nexthop, dot-nexthop``). ``dane``, ``dane-only`` and ``fingerprint`` are
refused (no DNSSEC resolver, no fingerprint support yet).

Match strategies: ``hostname`` (the server's host name, from MX or the
nexthop), ``nexthop`` (the nexthop domain), ``dot-nexthop`` (any subdomain of
it), a name starting with ``.`` (any subdomain of that name) and any other
string (that literal name). Certificate names are the DNS and IP subjectAltNames,
or the subject CN when there is no DNS name; ``*.`` matches one leftmost label.

Theory of operation: the chain is checked by OpenSSL during the handshake
(contexts for ``verify``/``secure`` require it), names are checked by us after
it. A chain that fails aborts the handshake, so the "Untrusted" line for those
levels says "not established"; at ``may``/``encrypt`` the chain is not checked
and an established session is logged as ``Untrusted`` (``Anonymous`` without a
certificate), as Postfix logs an unauthenticated peer.
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Any

from qmgrd.delivery.mx import Destination, Endpoint
from qmgrd.delivery.replies import Failure
from qmgrd.errors import ConfigError
from qmgrd.tables import LookupTable

LEVELS = ("none", "may", "encrypt", "verify", "secure")
MANDATORY = frozenset({"encrypt", "verify", "secure"})
AUTHENTICATED = frozenset({"verify", "secure"})
_REFUSED = {
    "dane": "DANE needs a DNSSEC-validating resolver, which qmgrd does not support yet",
    "dane-only": "DANE needs a DNSSEC-validating resolver, which qmgrd does not support yet",
    "fingerprint": "certificate fingerprint matching is not supported yet",
}
_PROTOCOLS = ("SSLv2", "SSLv3", "TLSv1", "TLSv1.1", "TLSv1.2", "TLSv1.3")
_VERSIONS = {
    "TLSv1.2": ssl.TLSVersion.TLSv1_2,
    "TLSv1.3": ssl.TLSVersion.TLSv1_3,
}
_POLICY_ATTRS = frozenset({"match", "protocols", "ciphers"})
CONFIG_PROBLEM = "client TLS configuration problem"


def check_level(level: str, param: str) -> str:
    """The level, or ConfigError naming ``param`` for an unknown or unsupported one."""
    if level in _REFUSED:
        raise ConfigError(f"{param} = {level}: {_REFUSED[level]}")
    if level not in LEVELS:
        raise ConfigError(
            f"{param}: unknown TLS security level {level!r} (expected one of {', '.join(LEVELS)})"
        )
    return level


def parse_protocols(text: str, param: str) -> tuple[str, str]:
    """Postfix protocol list -> (lowest, highest) protocol name allowed.

    Accepts ``>=TLSv1.2``, ``<=TLSv1.3``, exclusions ``!SSLv3`` and inclusions
    ``TLSv1.2 TLSv1.3`` (separated by commas, spaces or colons). A gap inside the
    range cannot be expressed with OpenSSL's min/max and is closed.
    """
    allowed = list(_PROTOCOLS)
    included: list[str] = []
    for token in text.replace(",", " ").replace(":", " ").split():
        op, name = "", token
        for prefix in (">=", "<=", "!"):
            if token.startswith(prefix):
                op, name = prefix, token[len(prefix) :]
                break
        if name not in _PROTOCOLS:
            raise ConfigError(
                f"{param}: unknown protocol {name!r} (expected one of {', '.join(_PROTOCOLS)})"
            )
        index = _PROTOCOLS.index(name)
        if op == ">=":
            allowed = [p for p in allowed if _PROTOCOLS.index(p) >= index]
        elif op == "<=":
            allowed = [p for p in allowed if _PROTOCOLS.index(p) <= index]
        elif op == "!":
            allowed = [p for p in allowed if p != name]
        else:
            included.append(name)
    if included:
        allowed = [p for p in allowed if p in included]
    if not allowed:
        raise ConfigError(f"{param} = {text!r}: no protocol left")
    return allowed[0], allowed[-1]


@dataclass(frozen=True, slots=True)
class TlsPolicy:
    """The TLS requirements for one destination."""

    level: str
    match: tuple[str, ...] = ()
    protocols: tuple[str, str] = ("TLSv1", "TLSv1.3")

    @property
    def mandatory(self) -> bool:
        """Whether delivery must not go on without TLS."""
        return self.level in MANDATORY


def _context(verify: bool, cafile: str, capath: str, protocols: tuple[str, str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False  # names are matched per policy by check_peer
    if verify:
        ctx.verify_mode = ssl.CERT_REQUIRED
        if cafile or capath:
            ctx.load_verify_locations(cafile=cafile or None, capath=capath or None)
        else:
            ctx.load_default_certs()
    else:
        ctx.verify_mode = ssl.CERT_NONE
    low, high = protocols
    # Versions below TLSv1.2 are never offered (the ssl module's floor); set only what tightens.
    if low in _VERSIONS and _VERSIONS[low] > ctx.minimum_version:
        ctx.minimum_version = _VERSIONS[low]
    if high in _VERSIONS:
        ctx.maximum_version = _VERSIONS[high]
    elif _PROTOCOLS.index(high) < _PROTOCOLS.index("TLSv1.2"):
        raise ConfigError(f"protocols up to {high} only: the ssl module offers TLSv1.2 at least")
    return ctx


class TlsClient:
    """TLS policy lookup, SSL contexts and certificate checks for one transport."""

    def __init__(
        self,
        *,
        level: str,
        cafile: str = "",
        capath: str = "",
        verify_cert_match: tuple[str, ...] = ("hostname",),
        secure_cert_match: tuple[str, ...] = ("nexthop", "dot-nexthop"),
        mandatory_protocols: str = ">=TLSv1",
        policy_maps: tuple[LookupTable, ...] = (),
    ) -> None:
        """Check files and lists and build the contexts; ConfigError naming the parameter."""
        self.level = check_level(level, "smtp_tls_security_level")
        for param, path, want_dir in (
            ("smtp_tls_CAfile", cafile, False),
            ("smtp_tls_CApath", capath, True),
        ):
            if path and not (os.path.isdir(path) if want_dir else os.path.isfile(path)):
                kind = "directory" if want_dir else "file"
                raise ConfigError(f"{param}: {path}: no such {kind}")
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"{param}: {path}: not readable")
        self.cafile, self.capath = cafile, capath
        self.verify_cert_match = verify_cert_match
        self.secure_cert_match = secure_cert_match
        self.protocols = parse_protocols(mandatory_protocols, "smtp_tls_mandatory_protocols")
        self.policy_maps = policy_maps
        self._default = self.default_policy()  # the level's policy: built once
        self._contexts: dict[tuple[bool, tuple[str, str]], ssl.SSLContext] = {}
        try:
            self.context(TlsPolicy("verify", protocols=self.protocols))  # loads the CA file now
        except ssl.SSLError as exc:
            where = cafile or capath or "the system store"
            raise ConfigError(f"smtp_tls_CAfile/CApath: cannot load {where}: {exc}") from None

    def default_policy(self, level: str | None = None) -> TlsPolicy:
        """The transport's policy at ``level`` (default: ``smtp_tls_security_level``)."""
        level = level or self.level
        match = self.secure_cert_match if level == "secure" else self.verify_cert_match
        protocols = self.protocols if level in MANDATORY else ("TLSv1", "TLSv1.3")
        return TlsPolicy(level, match, protocols)

    def policy_for(self, dest: Destination) -> TlsPolicy | Failure:
        """The policy of ``dest``: its policy map entry, else the transport's level."""
        for table in self.policy_maps:
            value = table.lookup(dest.label)
            if value is None and dest.label != dest.host and dest.mx:
                value = table.lookup(dest.host)
            if value is not None:
                return self._parse_entry(dest, table.spec, value)
        return self._default

    def _parse_entry(self, dest: Destination, spec: str, value: str) -> TlsPolicy | Failure:
        words = value.split()
        level = words[0] if words else ""
        problem = Failure("4.7.5", CONFIG_PROBLEM)
        try:
            check_level(level, f"smtp_tls_policy_maps {spec}: {dest.label}")
        except ConfigError:
            return problem
        policy = self.default_policy(level)
        match, protocols = policy.match, policy.protocols
        for word in words[1:]:
            name, sep, arg = word.partition("=")
            if not sep or name not in _POLICY_ATTRS:
                return problem
            if name == "match":
                match = tuple(part for part in arg.split(":") if part)
            elif name == "protocols":
                try:
                    protocols = parse_protocols(arg, "protocols")
                except ConfigError:
                    return problem
        return TlsPolicy(level, match, protocols)

    def context(self, policy: TlsPolicy) -> ssl.SSLContext:
        """The SSL context for a policy (built once per kind and protocol range)."""
        verify = policy.level in AUTHENTICATED
        key = (verify, policy.protocols)
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = _context(verify, self.cafile, self.capath, policy.protocols)
            self._contexts[key] = ctx
        return ctx

    def check_peer(
        self, policy: TlsPolicy, peercert: dict[str, Any] | None, dest: Destination, ep: Endpoint
    ) -> bool:
        """Whether the (chain-verified) certificate has a name the policy accepts."""
        if policy.level not in AUTHENTICATED:
            return True
        if not peercert:
            return False
        names = certificate_names(peercert)
        return any(
            _matches(name, want) for want in _wanted(policy.match, dest, ep) for name in names
        )


def _wanted(match: tuple[str, ...], dest: Destination, ep: Endpoint) -> list[str]:
    """Expand match strategies to names; a leading "." means "any subdomain of"."""
    out: list[str] = []
    for strategy in match:
        if strategy == "hostname":
            out.append(ep.host)
        elif strategy == "nexthop":
            out.append(dest.host)
        elif strategy == "dot-nexthop":
            out.append("." + dest.host)
        else:
            out.append(strategy)
    return [name.lower().rstrip(".") for name in out if name]


def certificate_names(peercert: dict[str, Any]) -> list[str]:
    """DNS and IP subjectAltNames, or the subject CN when there is no DNS name."""
    names: list[str] = []
    has_dns = False
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS":
            has_dns = True
            names.append(str(value).lower())
        elif kind == "IP Address":
            names.append(str(value).strip().lower())
    if not has_dns:
        for rdn in peercert.get("subject", ()):
            for key, value in rdn:
                if key == "commonName":
                    names.append(str(value).lower())
    return names


def _same_ip(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return False


def _matches(cert_name: str, want: str) -> bool:
    """Whether a certificate name satisfies one wanted name (RFC 6125 §6.4, one-label wildcard)."""
    if want.startswith("."):
        parent = want[1:]
        if cert_name.startswith("*."):
            return cert_name[2:].endswith("." + parent) or cert_name[2:] == parent
        return cert_name.endswith(want)
    if cert_name == want or _same_ip(cert_name, want):
        return True
    if cert_name.startswith("*.") and "." in want:
        return want.split(".", 1)[1] == cert_name[2:]
    return False


def describe(ssl_object: Any) -> str:
    """``TLSv1.3 with cipher TLS_AES_256_GCM_SHA384 (256/256 bits)`` for an SSL object."""
    cipher = ssl_object.cipher() if ssl_object is not None else None
    if not cipher:
        return "unknown protocol"
    name, version, bits = cipher
    return f"{ssl_object.version() or version} with cipher {name} ({bits}/{bits} bits)"
