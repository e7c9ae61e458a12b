"""Recipient address -> (transport, nexthop, address) and destination queue names (notes §3.4).

Contract
--------
``TransportTable(find)`` wraps the ``transport_maps`` search, which the caller builds outside the
core (``qmgrd.daemon.settings`` opens the tables with ``qmgrd.tables`` and passes
``find(address, recipient_delimiter) -> value | None``; core never reads files).
``Resolver(settings).resolve(address)`` never raises for a bad address: bad input
becomes a route to the ``error`` transport, just as Postfix's trivial-rewrite does, because a
recipient problem is a delivery result, not an exception. ``queue_name`` gives the key of the
destination queue a resolved recipient joins.

Routing rules, in order of precedence (transport(5), postconf(5) ``default_transport``):

1. Null address -> ``error`` "5.1.3 null recipient address"; unparsable address -> ``error``
   "5.1.3 bad address syntax".
2. ``transport_maps`` lookup (done by ``find``, transport(5)): ``user+ext@domain``, ``user@domain``
   (when a recipient delimiter is set), ``domain``, then ``.parent`` domains from the closest up
   (``.example.com`` matches every subdomain of example.com, never example.com itself), then
   ``*``. The first key found in any table wins; within one key, tables are searched in order.
3. A table value ``transport:nexthop`` may leave either part empty: an empty transport means the
   default route's transport, an empty nexthop means the default route's nexthop.
4. The default route: ``default_transport`` (``transport[:nexthop]``); its nexthop if it has one,
   else the sender-dependent relayhost (``sender_dependent_relayhost_maps``: the sender address,
   then ``@domain``; ``<>`` for the null sender), else ``relayhost`` if set, else the recipient
   domain. ``relayhost`` (and a sender-dependent one) may list several destinations; the SMTP
   agent tries them in order.
5. ``error`` and ``retry`` keep their nexthop as DSN text, given a default status code if it has
   none (5.0.0 / 4.0.0).
6. A transport listed in ``defer_transports`` becomes ``retry`` "4.3.2 deferred transport" unless
   the message is being flushed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "EMPTY",
    "ERROR_TRANSPORT",
    "RETRY_TRANSPORT",
    "Resolved",
    "Resolver",
    "ResolverSettings",
    "TransportFind",
    "TransportTable",
    "queue_name",
]

ERROR_TRANSPORT = "error"
RETRY_TRANSPORT = "retry"

BAD_SYNTAX = "5.1.3 bad address syntax"
NULL_RECIPIENT = "5.1.3 null recipient address"
DEFERRED_TRANSPORT = "4.3.2 deferred transport"

_DSN_STATUS_RE = re.compile(r"^[245]\.\d{1,3}\.\d{1,3}(?:\s|$)")
_DEFAULT_TEXT = {
    ERROR_TRANSPORT: ("5.0.0", "mail delivery failed"),
    RETRY_TRANSPORT: ("4.0.0", "mail delivery deferred"),
}
# A domain is dot-separated labels (letters, digits, hyphen, underscore, or non-ASCII for
# internationalized names) or an address literal such as [192.0.2.1] / [IPv6:2001:db8::1].
# _domain_of's character checks as one regular expression each (every recipient is routed):
# the dot-separated labels of a domain (letters, digits, ``_``, ``-``, non-ASCII), a control
# character, white space (``\s`` is ``str.isspace``).
_DOMAIN_RE = re.compile(r"[A-Za-z0-9_\-\u0080-\U0010ffff]+(?:\.[A-Za-z0-9_\-\u0080-\U0010ffff]+)*")
_CONTROL_RE = re.compile("[\x00-\x1f\x7f]")
_SPACE_RE = re.compile(r"\s")
_LITERAL_RE = re.compile(r"^\[[A-Za-z0-9.:\-]+\]$")


@dataclass(frozen=True, slots=True, init=False)
class Resolved:
    """Where one recipient goes: a master.cf service, its nexthop, and the address itself.

    For ``error`` and ``retry`` the nexthop is the DSN text ("5.1.3 bad address syntax").
    """

    transport: str
    nexthop: str
    address: str

    def __init__(self, transport: str, nexthop: str, address: str) -> None:
        """The fields, in order, each slot set directly: one is built per recipient, and the
        generated ``__init__`` of a frozen dataclass pays an ``object.__setattr__`` per field
        (``qmgrd.core.message._setters``). Still frozen, with the generated ``==``/``hash``."""
        _R_TRANSPORT(self, transport)
        _R_NEXTHOP(self, nexthop)
        _R_ADDRESS(self, address)


_R_TRANSPORT, _R_NEXTHOP, _R_ADDRESS = (
    Resolved.__dict__[name].__set__ for name in ("transport", "nexthop", "address")
)


TransportFind = Callable[[str, str], str | None]
"""``find(address, recipient_delimiter)``: the ``transport_maps`` value for a recipient, or None."""


@dataclass(frozen=True, slots=True, eq=False)
class TransportTable:
    """The ``transport_maps`` search, built outside the core; None matches nothing."""

    find: TransportFind | None = None

    def lookup(self, address: str, *, recipient_delimiter: str = "") -> str | None:
        """Return the table value for a recipient address, or None (rules in the module doc)."""
        if self.find is None:
            return None
        return self.find(address, recipient_delimiter)


EMPTY = TransportTable()
"""The table that matches nothing (no ``transport_maps``)."""


@dataclass(frozen=True, slots=True)
class ResolverSettings:
    """The configuration the resolver needs, parsed once (a reload builds a new one).

    ``recipient_delimiter`` (an addition to the agreed interface, with a harmless default) enables
    the ``user@domain`` lookup of ``user+ext@domain``. ``sender_relayhost`` looks one key up in
    ``sender_dependent_relayhost_maps`` (tables read when opened: the call does no I/O); None
    when there are none.
    """

    default_transport: str = "smtp"
    relayhost: str = ""
    transport_table: TransportTable = EMPTY
    defer_transports: frozenset[str] = frozenset()
    recipient_delimiter: str = ""
    sender_relayhost: Callable[[str], str | None] | None = None


class Resolver:
    """Routes recipient addresses with fixed settings; holds no mutable state."""

    __slots__ = ("_default_nexthop_explicit", "_default_transport", "_settings")

    def __init__(self, settings: ResolverSettings) -> None:
        """Split ``default_transport`` into its transport and optional nexthop once."""
        transport, _sep, nexthop = settings.default_transport.partition(":")
        if not transport:
            raise ValueError(
                f"default_transport = {settings.default_transport!r}: empty transport name"
            )
        self._settings = settings
        self._default_transport = transport
        self._default_nexthop_explicit = nexthop.strip()

    @property
    def settings(self) -> ResolverSettings:
        """The settings this resolver was built with."""
        return self._settings

    def resolve(self, address: str, *, flush: bool = False, sender: str | None = None) -> Resolved:
        """Route one recipient address (rules in the module doc). Never raises for bad input.

        ``flush`` is true while a message is being flushed (``qmgrd flush``): it lifts
        ``defer_transports``. ``sender`` (None = unknown) selects a sender-dependent relayhost.
        """
        settings = self._settings
        stripped = address.strip()
        if stripped in ("", "<>"):
            return Resolved(ERROR_TRANSPORT, NULL_RECIPIENT, address)
        domain = _domain_of(stripped)
        if domain is None:
            return Resolved(ERROR_TRANSPORT, BAD_SYNTAX, address)
        transport = self._default_transport
        # The nexthop somebody wrote down for this route (default_transport's own, or the
        # table's); error/retry use it as DSN text and ignore the relayhost/domain fallback.
        explicit = self._default_nexthop_explicit
        find = settings.transport_table.find  # TransportTable.lookup, inlined (per recipient)
        value = None if find is None else find(stripped, settings.recipient_delimiter)
        if value is not None:
            table_transport, _sep, table_nexthop = value.partition(":")
            table_transport, table_nexthop = table_transport.strip(), table_nexthop.strip()
            if table_transport:
                transport = table_transport
            if table_nexthop:
                explicit = table_nexthop
            elif transport != self._default_transport:
                explicit = ""
        if transport in _DEFAULT_TEXT:
            nexthop = _dsn_text(transport, explicit)
        else:
            nexthop = explicit or self._sender_relayhost(sender) or settings.relayhost or domain
        if transport in settings.defer_transports and not flush:
            return Resolved(RETRY_TRANSPORT, DEFERRED_TRANSPORT, address)
        return Resolved(transport, nexthop, address)

    def _sender_relayhost(self, sender: str | None) -> str:
        """The sender-dependent relayhost: the address, then ``@domain`` (``<>`` if null)."""
        lookup = self._settings.sender_relayhost
        if lookup is None or sender is None:
            return ""
        if not sender:
            return (lookup("<>") or "").strip()
        found = lookup(sender)
        at = sender.rfind("@")
        if found is None and at >= 0:
            found = lookup(sender[at:])
        return (found or "").strip()


def queue_name(resolved: Resolved, *, recipient_limit: int, recipient_delimiter: str = "") -> str:
    """The destination queue key for a resolved recipient (notes §3.4 step 4, §13.28).

    Normally the nexthop. When the transport delivers one recipient per request
    (``recipient_limit == 1``) and is not ``error`` or ``retry``, it is ``localpart@nexthop`` with
    the address extension removed, so concurrency is per recipient and ``user+ext`` shares the
    queue of ``user``. Always lowercased.
    """
    if recipient_limit == 1 and resolved.transport not in _DEFAULT_TEXT:
        address = resolved.address
        at = address.rfind("@")
        local = address[:at] if at >= 0 else address
        local = _strip_extension(local, recipient_delimiter)
        return f"{local}@{resolved.nexthop}".lower()
    return resolved.nexthop.lower()


def _strip_extension(local: str, delimiter: str) -> str:
    """Cut the localpart at the first delimiter character (each character of ``delimiter`` counts,
    as in Postfix >= 2.11); a localpart that starts with one keeps it whole."""
    if not delimiter:
        return local
    cut = min((i for i in (local.find(c, 1) for c in delimiter) if i > 0), default=-1)
    return local[:cut] if cut > 0 else local


def _domain_of(address: str) -> str | None:
    """The lowercased domain of a syntactically plausible ``local@domain``, else None.

    Deliberately lenient (the listener already enforced RFC 5321 on input): it rejects only what
    cannot be routed: no ``@``, an empty localpart or domain, control characters, whitespace
    outside a quoted local part (``"sp ace"@d`` is valid, RFC 5321 §4.1.2), and malformed
    domains.
    """
    at = address.rfind("@")
    if at <= 0 or at == len(address) - 1:
        return None
    if _CONTROL_RE.search(address):
        return None
    local, domain = address[:at], address[at + 1 :]
    quoted = len(local) >= 2 and local.startswith('"') and local.endswith('"')
    if not quoted and _SPACE_RE.search(local):
        return None
    if "@" in local and not quoted:
        return None
    if domain.startswith("["):
        return domain.lower() if _LITERAL_RE.match(domain) else None
    domain = domain.rstrip(".") if domain.endswith(".") and len(domain) > 1 else domain
    if not _DOMAIN_RE.fullmatch(domain):
        return None
    return domain.lower()


def _dsn_text(transport: str, text: str) -> str:
    """Give error/retry text a DSN status code when it lacks one (error(8), dsn_split)."""
    status, reason = _DEFAULT_TEXT[transport]
    if not text:
        return f"{status} {reason}"
    if _DSN_STATUS_RE.match(text):
        return text
    return f"{status} {text}"
