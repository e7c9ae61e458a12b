"""main.cf and master.cf syntax: logical lines, comments, -o forms, and located errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.config.files import parse_main_cf, parse_master_cf, read_text
from qmgrd.errors import ConfigError

MAIN = Path("/etc/qmgrd/main.cf")
MASTER = Path("/etc/qmgrd/master.cf")


def values(text: str) -> dict[str, str]:
    return {name: s.value for name, s in parse_main_cf(text, MAIN).items()}


def test_continuation_lines_join_with_one_space() -> None:
    """A line starting with whitespace continues the previous one; the entry keeps line 1."""
    settings = parse_main_cf(
        "mynetworks = 127.0.0.0/8,\n    [::1]/128\n\t10.0.0.0/8\nx = 1\n", MAIN
    )
    assert settings["mynetworks"].value == "127.0.0.0/8, [::1]/128 10.0.0.0/8"
    assert settings["mynetworks"].line == 1
    assert settings["x"].line == 4


def test_comments_and_blank_lines() -> None:
    """# lines (also indented, also inside a continued entry) and blank lines are skipped."""
    text = (
        "# top\n\nrelayhost =\n  # an indented comment\n   [mx.example]\n   \nsoft_bounce = yes\n"
    )
    assert values(text) == {"relayhost": "[mx.example]", "soft_bounce": "yes"}


def test_hash_inside_a_value_is_not_a_comment() -> None:
    """There are no trailing comments in main.cf: # after a value is part of it."""
    assert values("mail_name = qmgrd # not a comment\n") == {"mail_name": "qmgrd # not a comment"}


def test_whitespace_around_equals_is_optional() -> None:
    """name=value, name = value and name  =value are the same; empty values are allowed."""
    assert values("a=1\nb = 2\nc  =3\nd =\n") == {"a": "1", "b": "2", "c": "3", "d": ""}


def test_value_keeps_equals_signs() -> None:
    """Only the first = separates name and value."""
    assert values("x = a=b\n") == {"x": "a=b"}


def test_later_setting_overrides_earlier() -> None:
    """The last setting of a name wins, and its line is the one recorded."""
    settings = parse_main_cf("a = 1\nb = 2\na = 3\n", MAIN)
    assert settings["a"].value == "3"
    assert settings["a"].line == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a = 1\njunk\n", "/etc/qmgrd/main.cf, line 2: missing '=' after parameter name: 'junk'"),
        ("  a = 1\n", "/etc/qmgrd/main.cf, line 1: logical line must not start with whitespace"),
        ("# c\n\n   a = 1\n", "/etc/qmgrd/main.cf, line 3: logical line must not start"),
        ("a = 1\nbad-name = 2\n", "/etc/qmgrd/main.cf, line 2: bad parameter name: 'bad-name'"),
        ("= 2\n", "/etc/qmgrd/main.cf, line 1: bad parameter name: ''"),
    ],
)
def test_main_cf_errors_name_file_and_line(text: str, message: str) -> None:
    """Each main.cf syntax error is a ConfigError naming the file and the line."""
    with pytest.raises(ConfigError) as info:
        parse_main_cf(text, MAIN)
    assert str(info.value).startswith(message)


def test_master_cf_fields_and_maxproc() -> None:
    """The eight fields are read; maxproc '-' stays unresolved (None) at this stage."""
    (smtp, relay) = parse_master_cf(
        "smtp unix - - n - - smtp\nrelay unix - - n - 7 smtp -v\n", MASTER
    )
    assert (smtp.name, smtp.type, smtp.maxproc, smtp.command, smtp.line) == (
        "smtp",
        "unix",
        None,
        "smtp",
        1,
    )
    assert (relay.maxproc, relay.args, relay.line) == (7, ("-v",), 2)


def test_master_cf_o_forms() -> None:
    """-o name=value, -oname=value and -o { name = value with blanks } all set overrides."""
    (entry,) = parse_master_cf(
        "relay unix - - n - - smtp -o smtp_helo_name=relay.example\n"
        "  -osmtp_connect_timeout=5s\n"
        "  # comment inside the entry\n"
        "  -o { smtp_fallback_relay = [a.example], [b.example] } -v\n",
        MASTER,
    )
    assert {n: s.value for n, s in entry.overrides.items()} == {
        "smtp_helo_name": "relay.example",
        "smtp_connect_timeout": "5s",
        "smtp_fallback_relay": "[a.example], [b.example]",
    }
    assert entry.args == ("-v",)
    assert all(s.line == 1 and s.file == MASTER for s in entry.overrides.values())


def test_master_cf_smtp_inet_and_unix_coexist() -> None:
    """Postfix keys services by name and type, so smtp inet and smtp unix may both exist."""
    entries = parse_master_cf("smtp inet n - n - - smtpd\nsmtp unix - - n - - smtp\n", MASTER)
    assert [(e.name, e.type) for e in entries] == [("smtp", "inet"), ("smtp", "unix")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("smtp unix - - n - -\n", "/etc/qmgrd/master.cf, line 1: expected 8 or more fields"),
        ("# x\nsmtp tcp - - n - - smtp\n", "/etc/qmgrd/master.cf, line 2: service smtp: bad type"),
        (
            "smtp unix - - n - lots smtp\n",
            "/etc/qmgrd/master.cf, line 1: service smtp: bad maxproc",
        ),
        (
            "a unix - - n - - smtp\na unix - - n - - smtp\n",
            "/etc/qmgrd/master.cf, line 2: duplicate service a (first defined at line 1)",
        ),
        ("a unix - - n - - smtp -o\n", "/etc/qmgrd/master.cf, line 1: service a: -o without"),
        ("a unix - - n - - smtp -o novalue\n", "/etc/qmgrd/master.cf, line 1: bad -o option"),
        ("a unix - - n - - smtp -o { x = 1\n", "/etc/qmgrd/master.cf, line 1: missing '}'"),
        ("bad/name unix - - n - - smtp\n", "/etc/qmgrd/master.cf, line 1: bad service name"),
        ("\n  a unix - - n - - smtp\n", "/etc/qmgrd/master.cf, line 2: logical line must not"),
    ],
)
def test_master_cf_errors_name_file_and_line(text: str, message: str) -> None:
    """Each master.cf syntax error is a ConfigError naming the file and the line."""
    with pytest.raises(ConfigError) as info:
        parse_master_cf(text, MASTER)
    assert str(info.value).startswith(message)


def test_read_text_errors_name_the_file(tmp_path: Path) -> None:
    """A missing or non-UTF-8 file is a ConfigError naming it."""
    with pytest.raises(ConfigError, match=r"main\.cf: file not found"):
        read_text(tmp_path / "main.cf")
    bad = tmp_path / "master.cf"
    bad.write_bytes(b"smtp \xff\n")
    with pytest.raises(ConfigError, match=r"master\.cf: not valid UTF-8"):
        read_text(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        read_text(tmp_path)
