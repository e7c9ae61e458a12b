"""Postfix's lookup orders for address keys, over a list of tables (``maps_find``).

Theory of operation
-------------------
Postfix turns one address into a sequence of query keys and sends each key
to every table of the parameter, in the order the tables are listed, before
trying the next key; the first value found wins. Pattern tables (``regexp:``,
``pcre:``, ``cidr:``) are asked only the full address: "user@domain mail
addresses are not broken up into their user and domain constituent parts,
nor is user+foo broken up into user and foo" (regexp_table(5)). Fixed tables
get every key, lower-cased.

The key sequences (``d`` is the domain, ``.p`` each parent domain of ``d`` from
the closest up; with ``parent_matches_subdomains`` the parents are tried as
``p`` instead of ``.p``, Postfix's ``parent_domain_matches_subdomains``):

- `Order.TRANSPORT` (transport(5)): ``user+ext@d``, ``user@d``, ``d``, parents,
  ``*``;
- `Order.ACCESS` (access(5)): ``user+ext@d``, ``user@d``, ``d``, parents,
  ``user+ext@``, ``user@``;
- `Order.ADDRESS` (generic(5), canonical(5), sender-dependent maps:
  mail_addr_find): ``user+ext@d``, ``user@d``, ``@d``.

The ``user@d`` and ``user@`` keys without the extension exist only when
``recipient_delimiter`` is set and the local part contains one of its
characters after the first position (each character counts, Postfix >= 2.11).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence

from qmgrd.tables.base import LookupTable

PATTERN_TYPES = frozenset({"regexp", "pcre", "cidr"})


class Order(enum.Enum):
    """Which documented key sequence to use."""

    TRANSPORT = "transport"
    ACCESS = "access"
    ADDRESS = "address"


def is_pattern_table(table: LookupTable) -> bool:
    """True for regexp/pcre/cidr tables, which see only the full address."""
    return table.spec.partition(":")[0] in PATTERN_TYPES


def strip_extension(local: str, delimiter: str) -> str:
    """The local part without its extension (cut at the first delimiter character after
    the first position); unchanged when there is none."""
    if not delimiter:
        return local
    cut = min((i for i in (local.find(c, 1) for c in delimiter) if i > 0), default=-1)
    return local[:cut] if cut > 0 else local


def domain_keys(domain: str, *, parent_matches_subdomains: bool = False) -> Iterator[str]:
    """``d`` then its parents (``.p`` or ``p``), closest first; an address literal has none."""
    domain = domain.lower().rstrip(".")
    if not domain:
        return
    yield domain
    if domain.startswith("["):
        return
    dot = domain.find(".", 1)
    while dot >= 0:
        yield domain[dot + 1 :] if parent_matches_subdomains else domain[dot:]
        dot = domain.find(".", dot + 1)


def address_keys(
    address: str,
    order: Order,
    *,
    recipient_delimiter: str = "",
    parent_matches_subdomains: bool = False,
) -> list[str]:
    """The fixed-table keys for ``address`` in lookup order (module doc), lower-cased.

    The first key is always the full address; an address without ``@`` is
    looked up as itself only.
    """
    lowered = address.lower()
    at = lowered.rfind("@")
    if at < 0:
        return [lowered]
    local, domain = lowered[:at], lowered[at + 1 :].rstrip(".")
    bare = strip_extension(local, recipient_delimiter)
    keys = [f"{local}@{domain}"]
    if bare != local:
        keys.append(f"{bare}@{domain}")
    if order is Order.ADDRESS:
        keys.append(f"@{domain}")
        return keys
    keys.extend(domain_keys(domain, parent_matches_subdomains=parent_matches_subdomains))
    if order is Order.TRANSPORT:
        keys.append("*")
    else:
        keys.append(f"{local}@")
        if bare != local:
            keys.append(f"{bare}@")
    return keys


def find_address(
    tables: Sequence[LookupTable],
    address: str,
    order: Order,
    *,
    recipient_delimiter: str = "",
    parent_matches_subdomains: bool = False,
) -> str | None:
    """Search ``tables`` for ``address`` in Postfix's order; the first value found, or None.

    The full address (as given, not lower-cased: a case-sensitive regexp
    sees it as written) goes to every table; the other keys only to fixed
    tables.
    """
    keys = address_keys(
        address,
        order,
        recipient_delimiter=recipient_delimiter,
        parent_matches_subdomains=parent_matches_subdomains,
    )
    for table in tables:
        found = table.lookup(address)
        if found is not None:
            return found
    fixed = [t for t in tables if not is_pattern_table(t)]
    for key in keys[1:]:
        for table in fixed:
            found = table.lookup(key)
            if found is not None:
                return found
    return None


def find_domain(
    tables: Sequence[LookupTable], domain: str, *, parent_matches_subdomains: bool = False
) -> str | None:
    """Look up a host or domain name: itself in every table, then its parents in fixed ones."""
    keys = list(domain_keys(domain, parent_matches_subdomains=parent_matches_subdomains))
    if not keys:
        return None
    for table in tables:
        found = table.lookup(keys[0] if not is_pattern_table(table) else domain)
        if found is not None:
            return found
    fixed = [t for t in tables if not is_pattern_table(t)]
    for key in keys[1:]:
        for table in fixed:
            found = table.lookup(key)
            if found is not None:
                return found
    return None
