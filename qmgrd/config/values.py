"""Typed values: turn an expanded parameter string into an int, seconds, bool, str or list.

`convert` is the only entry point used by `Config`; it raises `ValueError`
with a short reason ("expected yes or no", "must be at least 1s"), which the
caller wraps into a `ConfigError` naming the file, the line and the parameter.
The syntaxes follow Postfix (postconf(5) "time units", mail_conf_bool.c,
mail_conf_int.c): times are one number with an optional unit, a bare number
takes the parameter's default unit; booleans are yes/no in any case; lists are
separated by commas and/or whitespace.
"""

from __future__ import annotations

import ipaddress
import re

from qmgrd.config.params import TIME_UNITS, Check, Param, ParamType

Value = int | bool | str | tuple[str, ...]

_INT_RE = re.compile(r"-?[0-9]+")
_TIME_RE = re.compile(r"([0-9]+)([smhdwSMHDW]?)")
_LIST_SPLIT_RE = re.compile(r"[\s,]+")
_HOST_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\*")


def parse_int(text: str) -> int:
    """A decimal integer, optionally negative (bounds are checked separately)."""
    if not _INT_RE.fullmatch(text):
        raise ValueError(f"expected an integer, got {text!r}")
    return int(text)


def parse_time(text: str, unit: str = "s") -> int:
    """Seconds from ``N`` or ``N<unit>``; a bare number is in ``unit`` (as Postfix does)."""
    m = _TIME_RE.fullmatch(text)
    if not m:
        raise ValueError(f"expected a time like 30s, 5m, 1h, 5d or 1w, got {text!r}")
    return int(m.group(1)) * TIME_UNITS[(m.group(2) or unit).lower()]


def parse_bool(text: str) -> bool:
    """``yes`` or ``no``, any case (Postfix accepts nothing else)."""
    low = text.lower()
    if low == "yes":
        return True
    if low == "no":
        return False
    raise ValueError(f"expected yes or no, got {text!r}")


def split_list(text: str) -> tuple[str, ...]:
    """Split on commas and whitespace, dropping empty elements.

    Text inside ``{ }`` stays in one element, as in Postfix lists, so a
    ``transport_maps`` entry like ``inline:{ a=b, c=d }`` is not torn apart.
    """
    if "{" not in text:
        return tuple(part for part in _LIST_SPLIT_RE.split(text) if part)
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}" and depth > 0:
            depth -= 1
        if depth == 0 and (ch == "," or ch.isspace()):
            if current:
                parts.append("".join(current))
                current = []
            continue
        current.append(ch)
    if current:
        parts.append("".join(current))
    return tuple(parts)


def parse_hostport(text: str) -> tuple[str, int]:
    """``host:port`` or ``[ipv6]:port`` -> (host, port); port 0 lets the OS choose.

    The host is returned without brackets. A host is an IP address or a host
    name; ``*`` means all addresses (returned as ``""``, what asyncio's
    ``create_server`` takes for that).
    """
    if text.startswith("["):
        close = text.find("]")
        if close < 0 or text[close + 1 : close + 2] != ":":
            raise ValueError(f"expected [address]:port, got {text!r}")
        host, port_text = text[1:close], text[close + 2 :]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError(f"bad IPv6 address in {text!r}") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"expected host:port, got {text!r}")
        if ":" in host:
            raise ValueError(f"write an IPv6 address in brackets, [{host}]:port, not {text!r}")
        if not _HOST_RE.fullmatch(host):
            raise ValueError(f"bad host in {text!r}")
    if not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"bad port in {text!r} (expected 0..65535)")
    return ("" if host == "*" else host), int(port_text)


def _format_bound(param: Param, bound: int) -> str:
    return f"{bound}s" if param.type is ParamType.TIME else str(bound)


def _check_bounds(param: Param, number: int) -> None:
    if param.minimum is not None and number < param.minimum:
        raise ValueError(f"must be at least {_format_bound(param, param.minimum)}")
    if param.maximum is not None and number > param.maximum:
        raise ValueError(f"must be at most {_format_bound(param, param.maximum)}")


def convert(param: Param, text: str) -> Value:
    """The typed value of ``text`` (already $-expanded) for ``param``; ValueError if bad."""
    text = text.strip()
    match param.type:
        case ParamType.INT:
            number = parse_int(text)
            _check_bounds(param, number)
            return number
        case ParamType.TIME:
            seconds = parse_time(text, param.unit)
            _check_bounds(param, seconds)
            return seconds
        case ParamType.BOOL:
            return parse_bool(text)
        case ParamType.LIST:
            items = split_list(text)
            if param.check is Check.HOSTPORT:
                for item in items:
                    parse_hostport(item)
            return items
        case ParamType.STR:
            if param.choices and text not in param.choices:
                allowed = ", ".join(c for c in param.choices if c) or "(empty)"
                raise ValueError(f"expected one of {allowed}, got {text!r}")
            if param.check is Check.HOSTPORT and text:
                parse_hostport(text)
            return text
    raise AssertionError(param.type)  # pragma: no cover - match is exhaustive
