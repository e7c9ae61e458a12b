"""Values checked at start and reload: host names, nexthops, listen addresses; the reload guard."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.config import Config, check_reloadable, load_config
from qmgrd.config.validate import destination_problem, hostname_problem, nexthop_problem
from qmgrd.errors import ConfigError

MASTER = "smtp unix - - n - - smtp\nrelay unix - - n - - smtp\n"


def load(tmp_path: Path, main: str, master: str = MASTER) -> Config:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(master)
    return load_config(tmp_path, hostname="h.example")


def error(tmp_path: Path, main: str, master: str = MASTER) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, main, master)
    return str(info.value)


@pytest.mark.parametrize(
    "value",
    [
        "mail.example.com",
        "[mail.example.com]",
        "[mail.example.com]:587",
        "mail.example.com:submission",
        "[192.0.2.1]:25",
        "[IPv6:2001:db8::1]:25",
        "[2001:db8::1]",
        "mail1.example:587, mail2.example:587",
        "example.com",
    ],
)
def test_good_relayhosts(tmp_path: Path, value: str) -> None:
    """Every relayhost form postconf(5) documents is accepted."""
    assert load(tmp_path, f"relayhost = {value}\n").get_str("relayhost") == value


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("[mail.example.com", "missing ']'"),
        ("[mail.example.com]x", "text after ']'"),
        ("mail.example.com:99999", "bad port '99999'"),
        ("mail.example.com:nosuchservice", "unknown service 'nosuchservice'"),
        ("[999.1.1.1]:25", "bad address literal"),
        ("mail..example.com", "bad host name label ''"),
        ("-mail.example.com", "bad host name label '-mail'"),
        ("2001:db8::1", "write an IPv6 address in brackets"),
        ("mail.example.com:", "bad port ''"),
    ],
)
def test_bad_relayhost_is_an_error_at_load(tmp_path: Path, value: str, problem: str) -> None:
    """A malformed relayhost fails the load with file, line, parameter and the problem."""
    message = error(tmp_path, f"# relay\nrelayhost = {value}\n")
    assert message.startswith(
        f"{tmp_path / 'main.cf'}, line 2: parameter relayhost: bad value {value!r}: "
    )
    assert problem in message


def test_myhostname_with_a_space_is_an_error(tmp_path: Path) -> None:
    """myhostname = 'mx example.com' is refused at load, not deferred at delivery."""
    message = error(tmp_path, "myhostname = mx example.com\n")
    assert message == (
        f"{tmp_path / 'main.cf'}, line 1: parameter myhostname: bad value 'mx example.com': "
        "a host name cannot contain white space"
    )


def test_helo_name_may_be_an_address_literal(tmp_path: Path) -> None:
    """smtp_helo_name accepts [192.0.2.1] but not a bad literal or a bad name."""
    assert load(tmp_path, "smtp_helo_name = [192.0.2.1]\n").get_str("smtp_helo_name")
    assert "bad address literal" in error(tmp_path, "smtp_helo_name = [not.an.ip]\n")
    assert "bad host name label" in error(tmp_path, "smtp_helo_name = a_b!c\n")


def test_default_transport_nexthop_checked_except_error_text(tmp_path: Path) -> None:
    """default_transport's nexthop is a destination; error:/retry: text is free-form."""
    assert "parameter default_transport" in error(tmp_path, "default_transport = relay:[x\n")
    load(tmp_path, "default_transport = error:5.7.1 mail is disabled here\n")
    assert "empty transport" in error(tmp_path, "default_transport = :[relay.example]\n")


def test_master_cf_override_is_checked_with_its_line(tmp_path: Path) -> None:
    """A bad value given with -o is reported at its master.cf line."""
    master = MASTER + "fast unix - - n - - smtp -o smtp_helo_name=bad..name\n"
    message = error(tmp_path, "", master)
    assert message.startswith(f"{tmp_path / 'master.cf'}, line 3: parameter smtp_helo_name: ")


def test_listen_address_host_names_are_checked(tmp_path: Path) -> None:
    """smtpd_listen hosts must be addresses or valid names."""
    load(tmp_path, "smtpd_listen = 127.0.0.1:25 [::1]:25 localhost:2525\n")
    assert "parameter smtpd_listen" in error(tmp_path, "smtpd_listen = bad_host!:25\n")


def test_problem_helpers() -> None:
    """The helpers agree with the documented syntax on a few edge cases."""
    assert hostname_problem("a" * 64) is not None
    assert hostname_problem("x." * 127 + "x") is not None  # 255 > 253 characters
    assert hostname_problem("localhost") is None
    assert hostname_problem("mx.example.com.") is None
    assert hostname_problem("192.0.2.1") is not None  # an address must be bracketed
    assert destination_problem("[mx.example]:25") is None
    assert nexthop_problem(" , ") == "empty nexthop"


# --- reload ---


def test_reload_refuses_a_changed_queue_directory(tmp_path: Path) -> None:
    """A changed queue_directory is refused with both values and what to do."""
    old = load(tmp_path, "queue_directory = spool-a\n")
    new = load(tmp_path, "myhostname = h.example\nqueue_directory = spool-b\n")
    with pytest.raises(ConfigError) as info:
        check_reloadable(old, new)
    assert str(info.value) == (
        f"{tmp_path / 'main.cf'}, line 2: parameter queue_directory cannot change on reload "
        f"(running with {str(tmp_path / 'spool-a')!r}, now {str(tmp_path / 'spool-b')!r}): "
        "restart qmgrd to apply it, or restore the running value"
    )


@pytest.mark.parametrize(
    "setting",
    [
        "smtpd_listen = 127.0.0.1:2526",
        "metrics_listen = 127.0.0.1:9100",
        "log_format = json",
        "syslog_name = postfix-out",
    ],
)
def test_reload_refuses_other_start_only_parameters(tmp_path: Path, setting: str) -> None:
    """Listen addresses and logging are bound at start: changing them is refused too."""
    old = load(tmp_path, "")
    new = load(tmp_path, f"{setting}\n")
    with pytest.raises(ConfigError, match="cannot change on reload"):
        check_reloadable(old, new)


def test_bad_syslog_name_is_refused_at_load(tmp_path: Path) -> None:
    """A syslog_name log tools could not split out of a line: file, line, parameter."""
    with pytest.raises(ConfigError) as info:
        load(tmp_path, "myhostname = h.example\nsyslog_name = mail out\n")
    assert str(info.value).startswith(
        f"{tmp_path / 'main.cf'}, line 2: parameter syslog_name: bad value 'mail out': contains"
    )


def test_reload_accepts_reloadable_changes(tmp_path: Path) -> None:
    """Everything else may change on reload (same spool written differently is no change)."""
    old = load(tmp_path, "queue_directory = spool\n")
    new = load(tmp_path, "queue_directory = ./spool/\nrelayhost = [relay.example]\n")
    check_reloadable(old, new)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("[mx.example]:0", "bad port '0'"),
        ("[mx.example]:p0rt!", "bad port 'p0rt!'"),
        ("[]", "empty host name"),
    ],
)
def test_more_relayhost_errors(tmp_path: Path, value: str, problem: str) -> None:
    """Port 0, a malformed service name and empty brackets are refused too."""
    assert problem in error(tmp_path, f"relayhost = {value}\n")
