"""Typed value syntax: every time unit, booleans, integers, lists, host:port, bounds."""

from __future__ import annotations

import pytest

from qmgrd.config.params import PARAMS
from qmgrd.config.values import (
    convert,
    parse_bool,
    parse_hostport,
    parse_int,
    parse_time,
    split_list,
)


@pytest.mark.parametrize(
    ("text", "unit", "seconds"),
    [
        ("45s", "s", 45),
        ("5m", "s", 300),
        ("2h", "s", 7200),
        ("5d", "s", 432000),
        ("1w", "s", 604800),
        ("3H", "s", 10800),
        ("0", "s", 0),
        ("30", "s", 30),
        ("4", "h", 14400),
        ("5", "d", 432000),
        ("2", "w", 1209600),
        ("10", "m", 600),
    ],
)
def test_time_units(text: str, unit: str, seconds: int) -> None:
    """Each unit s m h d w converts to seconds; a bare number uses the parameter's unit."""
    assert parse_time(text, unit) == seconds


@pytest.mark.parametrize("text", ["", "s", "5x", "1.5h", "-3s", "5 d", "1h30m", "five"])
def test_bad_times(text: str) -> None:
    """Anything but one non-negative integer with an optional unit letter is rejected."""
    with pytest.raises(ValueError, match="expected a time"):
        parse_time(text)


@pytest.mark.parametrize(
    ("text", "value"), [("yes", True), ("no", False), ("YES", True), ("No", False)]
)
def test_bool(text: str, value: bool) -> None:
    """yes/no in any case are the only booleans, as in Postfix."""
    assert parse_bool(text) is value


@pytest.mark.parametrize("text", ["true", "1", "", "y", "off"])
def test_bad_bool(text: str) -> None:
    """true, 1, on/off and the like are not Postfix booleans."""
    with pytest.raises(ValueError, match="expected yes or no"):
        parse_bool(text)


def test_int() -> None:
    """Decimal integers parse, including negatives (bounds are separate); junk does not."""
    assert parse_int("20000") == 20000
    assert parse_int("-1") == -1
    for bad in ("", "1k", "0x10", "1 2", "1.0"):
        with pytest.raises(ValueError, match="expected an integer"):
            parse_int(bad)


def test_list_separators() -> None:
    """Lists split on commas, blanks or both, and drop empty elements."""
    assert split_list("a, b  c,,d\te") == ("a", "b", "c", "d", "e")
    assert split_list("") == ()
    assert split_list(" , ") == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:25", ("127.0.0.1", 25)),
        ("localhost:10025", ("localhost", 10025)),
        ("[::1]:25", ("::1", 25)),
        ("*:25", ("", 25)),
        ("127.0.0.1:0", ("127.0.0.1", 0)),
    ],
)
def test_hostport(text: str, expected: tuple[str, int]) -> None:
    """host:port and [ipv6]:port parse; * means every address."""
    assert parse_hostport(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("127.0.0.1", "expected host:port"),
        (":25", "expected host:port"),
        ("::1:25", "brackets"),
        ("[::1]25", r"\[address\]:port"),
        ("[nothost]:25", "bad IPv6"),
        ("host:99999", "bad port"),
        ("host:x", "bad port"),
        ("ho st:25", "bad host"),
    ],
)
def test_bad_hostport(text: str, message: str) -> None:
    """Malformed listen addresses are rejected with a reason."""
    with pytest.raises(ValueError, match=message):
        parse_hostport(text)


def test_convert_checks_bounds_in_the_parameter_unit() -> None:
    """Bounds apply after conversion; time bounds are reported in seconds."""
    discount = PARAMS["default_delivery_slot_discount"]
    assert convert(discount, "100") == 100
    with pytest.raises(ValueError, match="at most 100"):
        convert(discount, "101")
    with pytest.raises(ValueError, match="at least 0"):
        convert(discount, "-1")
    lifetime = PARAMS["maximal_queue_lifetime"]
    assert convert(lifetime, "100") == 100 * 86400
    with pytest.raises(ValueError, match="at most 8640000s"):
        convert(lifetime, "101d")
    with pytest.raises(ValueError, match="at least 1s"):
        convert(PARAMS["smtp_helo_timeout"], "0")


def test_convert_choices_and_hostport_checks() -> None:
    """Enumerated strings accept only their values; host:port checks apply to lists too."""
    level = PARAMS["smtp_tls_security_level"]
    assert convert(level, "") == ""
    assert convert(level, " encrypt ") == "encrypt"
    with pytest.raises(ValueError, match="none, may, encrypt"):
        convert(level, "dane")
    with pytest.raises(ValueError, match="postfix, json"):
        convert(PARAMS["log_format"], "xml")
    listen = PARAMS["smtpd_listen"]
    assert convert(listen, "127.0.0.1:25, [::1]:25") == ("127.0.0.1:25", "[::1]:25")
    with pytest.raises(ValueError, match="bad port"):
        convert(listen, "127.0.0.1:25 [::1]:x")
    assert convert(PARAMS["metrics_listen"], "") == ""
    with pytest.raises(ValueError, match="host:port"):
        convert(PARAMS["metrics_listen"], "9100")


def test_split_list_keeps_braced_groups_whole() -> None:
    """A list element with `{ }` (an inline table) is not split at its inner commas and spaces."""
    from qmgrd.config.values import split_list

    assert split_list("inline:{ a=b, c=d }, texthash:/x") == ("inline:{ a=b, c=d }", "texthash:/x")
    assert split_list("a, b  c") == ("a", "b", "c")
