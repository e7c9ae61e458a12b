"""Parsing the arguments of MAIL FROM and RCPT TO (RFC 5321 §4.1.2, RFC 6531).

``parse_path`` splits ``<local@domain> PARAM=value ...`` into the address and
its parameters, and checks the address syntax. It is deliberately a little
more lenient than RFC 5321 where Postfix is (angle brackets may be omitted,
a source route is accepted and dropped, consecutive dots in a local part are
tolerated) and strict where a relay must be: the address needs a domain
(except ``<postmaster>`` as a recipient, RFC 5321 §4.5.1, any case), may
contain no control character (a TAB inside quotes excepted, as RFC 5322's
folding white space; it is what it looks like), not even backslash-escaped in
a quoted local part (RFC 5321 §4.1.2: quoted-pairSMTP is %d92 %d32-126), no
space outside a quoted local part (``"sp ace"@d`` is valid), no byte that is
not UTF-8 (escaped or not: such a byte could only be relayed as a different
mailbox), and non-ASCII characters only when the client announced SMTPUTF8.

The address is returned exactly as the client sent it (quotes and escapes
included): it is stored and relayed unchanged.
"""

from __future__ import annotations

import ipaddress
import string
from collections.abc import Callable
from dataclasses import dataclass

_ATEXT = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-/=?^_`{|}~.")
_LABEL = frozenset(string.ascii_letters + string.digits + "-")


class AddressError(ValueError):
    """The address is malformed; ``str()`` says why (not sent to the client)."""


# Not frozen (STYLE 5's exception for a hot value): two are built per message, and a
# frozen dataclass's __init__ pays an object.__setattr__ call per field.
@dataclass(slots=True)
class Path:
    """A parsed reverse- or forward-path: the address and the ESMTP parameter words."""

    address: str  # "" for the null reverse-path
    params: tuple[str, ...]
    non_ascii: bool  # the address contains UTF-8 (needs SMTPUTF8)
    given: str = ""  # the address as the client sent it, before ``rewrite``


def parse_path(
    arg: str, *, recipient: bool = False, rewrite: Callable[[str], str] | None = None
) -> Path:
    """Split and check ``<address> params``; raises AddressError on bad syntax.

    ``recipient``: a forward-path, where ``<postmaster>`` alone is allowed.
    ``rewrite``: cleanup's envelope rewriting (``root`` -> ``root@$myorigin``,
    canonical maps), applied before the syntax check, which the result must pass.
    """
    text = arg.lstrip(" ")
    if text.startswith("<"):
        end = _closing_bracket(text, ">")
        inner, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(" "):
            raise AddressError("text after the closing bracket")
    else:
        end = _closing_bracket(text + " ", " ")
        inner, rest = text[:end], text[end + 1 :]
    if inner.startswith("@"):  # source route "@a,@b:user@c" (RFC 5321 §4.1.2): dropped
        colon = inner.find(":")
        if colon < 0:
            raise AddressError("bad source route")
        inner = inner[colon + 1 :]
    given = inner
    if inner and rewrite is not None:
        if not inner.isascii():
            try:
                inner.encode("utf-8")  # undecodable bytes arrive as surrogates
            except UnicodeEncodeError:
                raise AddressError("not UTF-8") from None
        inner = rewrite(inner)
    if inner and not (recipient and inner.lower() == "postmaster"):
        check_mailbox(inner)
    return Path(inner, tuple(rest.split()), not inner.isascii(), given)


def _closing_bracket(text: str, close: str) -> int:
    """Index of the first ``close`` outside a quoted string (escapes honoured)."""
    if '"' not in text:  # no quoted string: the first one (a backslash escapes only in quotes)
        end = text.find(close)
        if end < 0:
            raise AddressError("missing closing bracket")
        return end
    quoted = escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\" and quoted:
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == close and not quoted:
            return i
    raise AddressError("missing closing bracket")


def check_mailbox(address: str) -> None:
    """Raise AddressError unless ``address`` is ``local-part@domain``."""
    at = address.rfind("@")
    if at <= 0:
        raise AddressError("no local part or no domain")
    local, domain = address[:at], address[at + 1 :]
    _check_local(local)
    _check_domain(domain)


def _check_local(local: str) -> None:
    if local.startswith('"'):
        if len(local) < 2 or not local.endswith('"'):
            raise AddressError("unterminated quoted local part")
        body = local[1:-1]
        i = 0
        while i < len(body):
            ch = body[i]
            if ch == "\\":
                i += 1
                if i == len(body):
                    raise AddressError("dangling backslash")
                if not " " <= body[i] <= "~":  # quoted-pairSMTP: %d92 %d32-126 only
                    raise AddressError("escaped control or non-ASCII character")
            elif ch == '"' or (ch.isascii() and not (ch.isprintable() or ch == "\t")):
                raise AddressError("bad character in quoted local part")
            elif not ch.isascii() and not ch.isprintable():
                raise AddressError("control character in local part")
            i += 1
        return
    if local.startswith(".") or local.endswith("."):
        raise AddressError("local part starts or ends with a dot")
    if _ATEXT.issuperset(local):  # the common case, in one pass in C
        return
    for ch in local:
        if ch in _ATEXT:
            continue
        if ch.isascii() or not ch.isprintable():
            raise AddressError(f"bad character {ch!r} in local part")


def _check_domain(domain: str) -> None:
    if not domain:
        raise AddressError("empty domain")
    if domain.startswith("["):
        if not domain.endswith("]"):
            raise AddressError("unterminated address literal")
        literal = domain[1:-1]
        try:
            if literal[:5].lower() == "ipv6:":
                ipaddress.IPv6Address(literal[5:])
            else:
                ipaddress.IPv4Address(literal)
        except ValueError:
            raise AddressError("bad address literal") from None
        return
    for label in domain.rstrip(".").split("."):
        if not label or label.startswith("-") or label.endswith("-"):
            raise AddressError("bad domain label")
        if _LABEL.issuperset(label):  # the common case, in one pass in C
            continue
        for ch in label:
            if ch in _LABEL:
                continue
            if ch.isascii() or not ch.isalnum():
                raise AddressError(f"bad character {ch!r} in domain")
