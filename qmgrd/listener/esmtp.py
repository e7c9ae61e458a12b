"""The ESMTP parameters of MAIL and RCPT (RFC 1870 SIZE, 6152 BODY, 6531 SMTPUTF8, 3461 DSN).

Pure functions: each takes the parameter words after the address and returns
either the parsed values or the reply to send (Postfix's smtpd texts).
"""

from __future__ import annotations

from typing import NamedTuple

from qmgrd.spool import RecipientSpec

_NOTIFY_WORDS = frozenset({"SUCCESS", "FAILURE", "DELAY"})


class MailParams(NamedTuple):
    """What MAIL FROM's parameters said.

    Immutable (it goes from here to the MAIL handler and into the envelope
    head) but a named tuple, not a frozen dataclass: built at every MAIL with
    parameters (SIZE= from most clients), and a frozen dataclass pays an
    ``object.__setattr__`` call per field. Tuple equality is harmless: no
    code compares or unpacks it; ``parse_mail_params`` callers tell it from
    a reply with ``isinstance(result, str)``.
    """

    size: int = 0  # SIZE=; 0 if not given
    body: str | None = None  # 7BIT | 8BITMIME
    smtputf8: bool = False
    ret: str | None = None  # FULL | HDRS
    envid: str | None = None  # xtext, as given (case-sensitive)


def _split(words: tuple[str, ...]) -> dict[str, str | None] | str:
    params: dict[str, str | None] = {}
    for word in words:
        key, eq, value = word.partition("=")
        key = key.upper()
        if key in params:
            return f"501 5.5.4 Error: duplicate {key} parameter"
        params[key] = value if eq else None
    return params


def parse_mail_params(words: tuple[str, ...], size_limit: int) -> MailParams | str:
    """MAIL FROM parameters, or the error reply (``size_limit`` 0 = none)."""
    params = _split(words)
    if isinstance(params, str):
        return params
    for key, value in params.items():
        if key == "SIZE":
            if value is None or not value.isdigit() or len(value) > 20:
                return "501 5.5.4 Bad SIZE parameter"
            if size_limit and int(value) > size_limit:
                return "552 5.3.4 Message size exceeds fixed limit"
        elif key == "BODY":
            if value is None or value.upper() not in ("7BIT", "8BITMIME"):
                return "501 5.5.4 Bad BODY keyword"
        elif key == "SMTPUTF8":
            if value is not None:
                return "501 5.5.4 Bad SMTPUTF8 parameter"
        elif key == "RET":
            if value is None or value.upper() not in ("FULL", "HDRS"):
                return "501 5.5.4 Bad RET parameter syntax"
        elif key == "ENVID":
            if not value or len(value) > 100 or not is_xtext(value):
                return "501 5.5.4 Bad ENVID parameter syntax"
        else:
            return f"555 5.5.4 Unsupported option: {key}"
    size, body, ret = params.get("SIZE"), params.get("BODY"), params.get("RET")
    return MailParams(
        size=int(size) if size else 0,
        body=body.upper() if body else None,
        smtputf8="SMTPUTF8" in params,
        ret=ret.upper() if ret else None,
        envid=params.get("ENVID"),
    )


def parse_rcpt_params(address: str, words: tuple[str, ...]) -> RecipientSpec | str:
    """RCPT TO parameters as a recipient, or the error reply."""
    notify: frozenset[str] = frozenset()
    orcpt: str | None = None
    seen: set[str] = set()
    for word in words:
        key, eq, value = word.partition("=")
        key = key.upper()
        if key in seen:
            return f"501 5.5.4 Error: duplicate {key} parameter"
        seen.add(key)
        if key == "NOTIFY":
            found = frozenset(value.upper().split(",")) if eq and value else frozenset()
            if not found or not (found == {"NEVER"} or found <= _NOTIFY_WORDS):
                return "501 5.5.4 Error: Bad NOTIFY parameter syntax"
            notify = found
        elif key == "ORCPT":
            addr_type, semi, xtext = value.partition(";")
            if not (eq and semi and addr_type and xtext and len(value) <= 500):
                return "501 5.5.4 Error: Bad ORCPT parameter syntax"
            orcpt = value
        else:
            return f"555 5.5.4 Unsupported option: {key}"
    return RecipientSpec(address, orcpt, notify)


def is_xtext(value: str) -> bool:
    """RFC 3461 §4: printable ASCII except "+" and "=", with "+XX" hex escapes."""
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "+":
            hexpart = value[i + 1 : i + 3]
            if len(hexpart) != 2 or any(c not in "0123456789ABCDEF" for c in hexpart):
                return False
            i += 3
            continue
        if not ("!" <= ch <= "~") or ch == "=":
            return False
        i += 1
    return True
