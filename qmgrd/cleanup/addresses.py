"""Address qualification, canonical mapping and masquerading (Postfix's trivial-rewrite + cleanup).

Contract
--------
`AddressRewriter.rewrite(address, role)` is pure apart from table lookups
and never raises for any input string: it returns the rewritten address, or
the address unchanged. ``role`` is one of `Role`: envelope or header, sender
or recipient; each step applies only to the roles its ``*_classes``
parameter lists. The order is Postfix's:

1. qualification (every role): a bare local part ``root`` gets
   ``@$myorigin`` (``append_at_myorigin``), ``user@host`` gets
   ``.$mydomain`` (``append_dot_mydomain``); the null address stays empty;
2. canonical mapping: ``sender_canonical_maps`` (senders) or
   ``recipient_canonical_maps`` (recipients), then ``canonical_maps``, each in
   canonical(5) lookup order (``user+ext@d``, ``user@d``, ``@d``). A result
   ``@domain`` keeps the local part; a match without the extension gets it
   back (``propagate_unmatched_extensions``). Mapping repeats on its result
   up to 10 times, as cleanup_map11 does, and stops when a result repeats;
3. masquerading: with ``masquerade_domains = example.com``, ``u@host.example.com``
   becomes ``u@example.com`` (the first listed domain that the address's
   domain is a subdomain of; ``!sub.example.com`` stops the search), except
   local parts in ``masquerade_exceptions``.

`rewrite_header_value(value, fn)` rewrites every address of an address
header's value in place (phrases, comments and group syntax kept byte for
byte), bounded by the value's length.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from qmgrd.tables import LookupTable, Order, address_keys, is_pattern_table, strip_extension

MAX_RECURSION = 10


class Role(enum.Enum):
    """Where an address is: Postfix's canonical_classes / masquerade_classes names."""

    ENVELOPE_SENDER = "envelope_sender"
    ENVELOPE_RECIPIENT = "envelope_recipient"
    HEADER_SENDER = "header_sender"
    HEADER_RECIPIENT = "header_recipient"

    @property
    def is_sender(self) -> bool:
        """True for the sender roles."""
        return self in (Role.ENVELOPE_SENDER, Role.HEADER_SENDER)


_ENVELOPE_SENDER, _ENVELOPE_RECIPIENT = Role.ENVELOPE_SENDER, Role.ENVELOPE_RECIPIENT


def _split(address: str) -> tuple[str, str | None]:
    at = address.rfind("@")
    if at < 0:
        return address, None
    return address[:at], address[at + 1 :]


def map_address(
    tables: Sequence[LookupTable], address: str, recipient_delimiter: str
) -> str | None:
    """One canonical(5)/generic(5) lookup; the new address or None (no match)."""
    if not tables or not address:
        return None
    local, domain = _split(address)
    for table in tables:
        if is_pattern_table(table):
            found = table.lookup(address)
            if found is not None:
                return _result(found.strip(), local, "")
    keys = address_keys(address, Order.ADDRESS, recipient_delimiter=recipient_delimiter)
    bare = strip_extension(local, recipient_delimiter)
    extension = local[len(bare) :] if domain is not None and bare != local else ""
    fixed = [t for t in tables if not is_pattern_table(t)]
    for index, key in enumerate(keys):
        for table in fixed:
            found = table.lookup(key)
            if found is not None:
                # the key without the extension matched: give the extension back
                unmatched = extension if index > 0 and extension else ""
                return _result(found.strip(), local, unmatched)
    return None


def _result(found: str, local: str, extension: str) -> str | None:
    if not found:
        return None
    first = found.split(",")[0].strip()  # canonical maps are 1:1; extra values ignored
    if first.startswith("@"):
        return f"{local}{first}"
    if extension:
        new_local, new_domain = _split(first)
        if new_domain is None:
            return first + extension
        return f"{new_local}{extension}@{new_domain}"
    return first


@dataclass(frozen=True, slots=True)
class AddressRewriter:
    """The rewriting parameters, with their tables opened (see the module doc)."""

    myorigin: str
    mydomain: str
    append_at_myorigin: bool = True
    append_dot_mydomain: bool = False
    recipient_delimiter: str = ""
    canonical_maps: tuple[LookupTable, ...] = ()
    sender_canonical_maps: tuple[LookupTable, ...] = ()
    recipient_canonical_maps: tuple[LookupTable, ...] = ()
    canonical_classes: frozenset[Role] = frozenset(Role)
    sender_canonical_classes: frozenset[Role] = frozenset(
        {Role.ENVELOPE_SENDER, Role.HEADER_SENDER}
    )
    recipient_canonical_classes: frozenset[Role] = frozenset(
        {Role.ENVELOPE_RECIPIENT, Role.HEADER_RECIPIENT}
    )
    masquerade_domains: tuple[str, ...] = ()
    masquerade_exceptions: frozenset[str] = frozenset()
    masquerade_classes: frozenset[Role] = frozenset(
        {Role.ENVELOPE_SENDER, Role.HEADER_SENDER, Role.HEADER_RECIPIENT}
    )
    # rewrites_nothing and changes_only_unqualified, worked out once (asked per address)
    _qualify_only: bool = field(init=False, repr=False, compare=False)
    _only_unqualified: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        qualify_only = not (
            self.canonical_maps
            or self.sender_canonical_maps
            or self.recipient_canonical_maps
            or self.masquerade_domains
        )
        object.__setattr__(self, "_qualify_only", qualify_only)
        object.__setattr__(self, "_only_unqualified", qualify_only and not self.append_dot_mydomain)

    @property
    def rewrites_nothing(self) -> bool:
        """True when rewrite() is the identity apart from qualification."""
        return self._qualify_only

    @property
    def changes_only_unqualified(self) -> bool:
        """True when rewrite() leaves every address with an ``@`` as it is."""
        return self._only_unqualified

    def qualify(self, address: str) -> str:
        """Step 1: ``root`` -> ``root@$myorigin``, ``u@host`` -> ``u@host.$mydomain``."""
        if not address:
            return address
        local, domain = _split(address)
        if domain is None:
            if self.append_at_myorigin and self.myorigin:
                return f"{address}@{self.myorigin}"
            return address
        if (
            self.append_dot_mydomain
            and self.mydomain
            and domain
            and "." not in domain
            and not domain.startswith("[")
        ):
            return f"{local}@{domain}.{self.mydomain}"
        return address

    def canonicalize(self, address: str, role: Role) -> str:
        """Step 2 (canonical maps); the address unchanged without a match."""
        steps: list[tuple[LookupTable, ...]] = []
        if role.is_sender and role in self.sender_canonical_classes:
            steps.append(self.sender_canonical_maps)
        if not role.is_sender and role in self.recipient_canonical_classes:
            steps.append(self.recipient_canonical_maps)
        if role in self.canonical_classes:
            steps.append(self.canonical_maps)
        for tables in steps:
            if not tables:
                continue
            seen = {address.lower()}
            for _ in range(MAX_RECURSION):
                new = map_address(tables, address, self.recipient_delimiter)
                if new is None:
                    break
                new = self.qualify(new)
                if new.lower() in seen:
                    address = new
                    break
                seen.add(new.lower())
                address = new
        return address

    def masquerade(self, address: str, role: Role) -> str:
        """Step 3 (masquerade_domains)."""
        if not self.masquerade_domains or role not in self.masquerade_classes:
            return address
        local, domain = _split(address)
        if domain is None or local.lower() in self.masquerade_exceptions:
            return address
        lowered = domain.lower().rstrip(".")
        for entry in self.masquerade_domains:
            negated = entry.startswith("!")
            name = entry[1:] if negated else entry
            name = name.lower().strip(".")
            if not name:
                continue
            if lowered == name and negated:
                return address
            if lowered.endswith("." + name):
                if negated:
                    return address
                return f"{local}@{name}"
        return address

    def envelope_sender(self, address: str) -> str:
        """``rewrite(address, Role.ENVELOPE_SENDER)`` (a bound method the listener passes)."""
        return self.rewrite(address, _ENVELOPE_SENDER)

    def envelope_recipient(self, address: str) -> str:
        """``rewrite(address, Role.ENVELOPE_RECIPIENT)``."""
        return self.rewrite(address, _ENVELOPE_RECIPIENT)

    def rewrite(self, address: str, role: Role) -> str:
        """All three steps, in Postfix's order."""
        if self._qualify_only:  # no tables, no masquerading: steps 2 and 3 keep it as it is
            return self.qualify(address)
        address = self.qualify(address)
        address = self.canonicalize(address, role)
        return self.masquerade(address, role)


# --- addresses inside header values --------------------------------------------------------

_SPECIALS_END = frozenset(",;:")


def rewrite_header_value(value: str, fn: Callable[[str], str]) -> str:
    """``value`` with each address replaced by ``fn(address)``; other text kept as it is.

    An address is what sits inside ``<...>``, or a whole list element without
    angle brackets (comments around it kept). Quoted strings, comments
    (nested) and group names are skipped. The scan is linear in the length.
    """
    out: list[str] = []
    i = 0
    n = len(value)
    element_start = 0  # start of the current list element in value
    saw_angle = False
    pieces: list[tuple[int, int]] = []  # bare (outside comments) spans of the element
    while i < n:
        c = value[i]
        if c == '"':
            j = _skip_quoted(value, i)
            pieces.append((i, j))
            i = j
            continue
        if c == "(":
            i = _skip_comment(value, i)
            continue
        if c == "<":
            close = value.find(">", i + 1)
            if close < 0:  # unbalanced: leave the rest of the value alone
                out.append(value[element_start:])
                return "".join(out)
            inner = value[i + 1 : close]
            out.append(value[element_start : i + 1])
            out.append(_rewrite_one(inner, fn))
            element_start = close
            saw_angle = True
            i = close + 1
            continue
        if c in _SPECIALS_END:
            if c == ":" and not saw_angle:
                # a group name ends here: what came before is a phrase, not an address
                pieces.clear()
                i += 1
                continue
            if not saw_angle:
                out.append(_bare(value, element_start, i, pieces, fn))
            else:
                out.append(value[element_start:i])
            out.append(c)
            i += 1
            element_start = i
            saw_angle = False
            pieces.clear()
            continue
        j = i
        while j < n and value[j] not in '"(<,;:':
            j += 1
        pieces.append((i, j))
        i = j
    if not saw_angle:
        out.append(_bare(value, element_start, n, pieces, fn))
    else:
        out.append(value[element_start:])
    return "".join(out)


def _bare(
    value: str, start: int, end: int, pieces: list[tuple[int, int]], fn: Callable[[str], str]
) -> str:
    """A list element without <...>: rewrite it when its text outside comments is one token."""
    segment = value[start:end]
    text = "".join(value[a:b] for a, b in pieces if a >= start and b <= end).strip()
    if not text or any(ch.isspace() for ch in text) or len(pieces) == 0:
        return segment
    first = min(a for a, _ in pieces if a >= start)
    last = max(b for _, b in pieces if b <= end)
    raw = value[first:last]
    lead = len(raw) - len(raw.lstrip())
    trail = len(raw) - len(raw.rstrip())
    core = raw.strip()
    if core != text:
        return segment  # a comment sits inside the address: leave it as written
    new = fn(core)
    return value[start:first] + raw[:lead] + new + raw[len(raw) - trail :] + value[last:end]


def _rewrite_one(inner: str, fn: Callable[[str], str]) -> str:
    stripped = inner.strip()
    if not stripped or any(ch.isspace() for ch in stripped) or "(" in stripped:
        return inner
    route, colon, addr = (
        stripped.rpartition(":") if stripped.startswith("@") else ("", "", stripped)
    )
    return f"{route}{colon}{fn(addr)}"


def _skip_quoted(value: str, i: int) -> int:
    j = i + 1
    n = len(value)
    while j < n:
        if value[j] == "\\":
            j += 2
            continue
        if value[j] == '"':
            return j + 1
        j += 1
    return n


def _skip_comment(value: str, i: int) -> int:
    depth = 0
    j = i
    n = len(value)
    while j < n:
        c = value[j]
        if c == "\\":
            j += 2
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return n
