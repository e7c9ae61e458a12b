"""load_config: $name expansion, loops, transport overrides, typed lookups, located errors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from qmgrd.config import Config, load_config
from qmgrd.errors import ConfigError, InvariantError

MASTER = """\
smtp      inet  n       -       n       -       -       smtpd
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
local     unix  -       n       n       -       -       local
"""

REPO_CONFIG = Path(__file__).resolve().parents[3] / "config"


def load(tmp_path: Path, main: str, master: str = MASTER) -> Config:
    (tmp_path / "main.cf").write_text(main)
    (tmp_path / "master.cf").write_text(master)
    return load_config(tmp_path, hostname="host.example.org")


def load_error(tmp_path: Path, main: str, master: str = MASTER) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, main, master)
    return str(info.value)


# --- expansion ---


def test_dollar_forms(tmp_path: Path) -> None:
    """$name, ${name} and $(name) expand; $$ is a literal dollar."""
    cfg = load(tmp_path, "a = x\nmail_name = $a-${a}-$(a)-$$a\n")
    assert cfg.get_str("mail_name") == "x-x-x-$a"


def test_nested_expansion(tmp_path: Path) -> None:
    """Expansion recurses through several levels of references."""
    cfg = load(
        tmp_path,
        "mydomain = example.com\nmyhostname = mx.$mydomain\nc = ${myhostname}\n"
        "smtp_helo_name = helo.$c\n",
    )
    assert cfg.get_str("smtp_helo_name") == "helo.mx.example.com"


def test_conditional_expansion(tmp_path: Path) -> None:
    """${name?text} gives text when name is non-empty, ${name:text} when it is empty."""
    cfg = load(
        tmp_path,
        "full = yes\nempty =\n"
        "relayhost = ${full?[$myhostname]}${empty?no}\n"
        "mail_name = ${empty:fallback}${full:no}\n",
    )
    assert cfg.get_str("relayhost") == "[host.example.org]"
    assert cfg.get_str("mail_name") == "fallback"


def test_undefined_name_expands_to_empty(tmp_path: Path) -> None:
    """An undefined $name is empty, as in Postfix, and not an error."""
    cfg = load(tmp_path, "mail_name = a${nothing}b$nothing_either\n")
    assert cfg.get_str("mail_name") == "ab"


def test_lone_dollar_and_unbalanced_brace_are_literal(tmp_path: Path) -> None:
    """A $ before a non-name and an unclosed ${ are kept as written."""
    cfg = load(tmp_path, "mail_name = cost $-5 ${oops\n")
    assert cfg.get_str("mail_name") == "cost $-5 ${oops"


def test_expansion_is_lazy(tmp_path: Path) -> None:
    """Defaults and earlier lines see values set later in main.cf."""
    cfg = load(tmp_path, "relayhost = [$myhostname]\nmyhostname = late.example\n")
    assert cfg.get_str("relayhost") == "[late.example]"
    assert cfg.get_str("smtp_helo_name") == "late.example"
    assert cfg.get_str("smtpd_banner") == "late.example ESMTP qmgrd"


def test_expansion_loop_is_an_error_naming_the_parameters(tmp_path: Path) -> None:
    """A loop through several names is a ConfigError naming them and where it starts."""
    message = load_error(tmp_path, "x = 1\na = $b\nb = ${c}\nc = $(a)\n")
    assert "main.cf, line 2: parameter a: expansion loop: a -> b -> c -> a" in message


def test_self_reference_is_a_loop(tmp_path: Path) -> None:
    """A parameter that references itself is a loop."""
    message = load_error(tmp_path, "mail_name = my $mail_name\n")
    assert "main.cf, line 1: parameter mail_name: expansion loop: mail_name -> mail_name" in message


def test_loop_through_a_default(tmp_path: Path) -> None:
    """A loop closed by a table default (smtp_helo_name = $myhostname) is found too."""
    message = load_error(tmp_path, "myhostname = $smtp_helo_name\n")
    assert "expansion loop: myhostname -> smtp_helo_name -> myhostname" in message
    assert "main.cf, line 1: parameter myhostname" in message


def test_loop_in_conditional_text(tmp_path: Path) -> None:
    """References inside ${name?text} are followed for loop detection."""
    message = load_error(tmp_path, "a = ${b?$a}\nb = 1\n")
    assert "expansion loop: a -> a" in message


# --- host-dependent defaults ---


def test_myhostname_and_mydomain_defaults(tmp_path: Path) -> None:
    """myhostname defaults to the host name, mydomain to it minus the first label."""
    cfg = load(tmp_path, "")
    assert cfg.get_str("myhostname") == "host.example.org"
    assert cfg.get_str("mydomain") == "example.org"
    (tmp_path / "main.cf").write_text("")
    bare = load_config(tmp_path, hostname="box")
    assert (bare.get_str("myhostname"), bare.get_str("mydomain")) == (
        "box.localdomain",
        "localdomain",
    )


def test_mydomain_follows_configured_myhostname(tmp_path: Path) -> None:
    """A configured myhostname changes the mydomain default, as in Postfix."""
    assert load(tmp_path, "myhostname = mx.other.net\n").get_str("mydomain") == "other.net"
    assert load(tmp_path, "myhostname = localhost\n").get_str("mydomain") == "localdomain"
    cfg = load(tmp_path, "myhostname = mx.$mydomain\n")
    assert cfg.get_str("myhostname") == "mx.example.org"


# --- typed lookups ---


def test_typed_getters(tmp_path: Path) -> None:
    """Each getter returns its type: ints, seconds, bools, tuples, strings."""
    cfg = load(
        tmp_path,
        "qmgr_message_active_limit = 500\nmaximal_queue_lifetime = 2\nsoft_bounce = YES\n"
        "mynetworks = 10.0.0.0/8, 192.168.0.0/16 [::1]/128\ndelay_warning_time = 4\n"
        "smtp_connect_timeout = 1m\n",
    )
    assert cfg.get_int("qmgr_message_active_limit") == 500
    assert cfg.get_time("maximal_queue_lifetime") == 2 * 86400
    assert cfg.get_time("delay_warning_time") == 4 * 3600
    assert cfg.get_time("smtp_connect_timeout") == 60
    assert cfg.get_bool("soft_bounce") is True
    assert cfg.get_bool("smtp_tls_connection_reuse") is False
    assert cfg.get_list("mynetworks") == ("10.0.0.0/8", "192.168.0.0/16", "[::1]/128")
    assert cfg.get_list("transport_maps") == ()
    assert cfg.get_str("qmgr_message_active_limit") == "500"
    assert cfg.get_hostports("smtpd_listen") == (("127.0.0.1", 25),)
    assert cfg.get_hostports("metrics_listen") == ()


def test_defaults_without_settings(tmp_path: Path) -> None:
    """An empty main.cf gives the table's defaults, typed."""
    cfg = load(tmp_path, "")
    assert cfg.get_int("default_destination_concurrency_limit") == 20
    assert cfg.get_time("minimal_backoff_time") == 300
    assert cfg.get_time("delay_warning_time") == 0
    assert cfg.get_str("smtp_tls_security_level") == ""
    assert cfg.get_list("smtp_fallback_relay") == ()
    assert cfg.get_list("defer_transports") == ()


def test_fallback_relay_feeds_smtp_fallback_relay(tmp_path: Path) -> None:
    """smtp_fallback_relay defaults to $fallback_relay."""
    cfg = load(tmp_path, "fallback_relay = [b1.example], [b2.example]\n")
    assert cfg.get_list("smtp_fallback_relay") == ("[b1.example]", "[b2.example]")


def test_bounce_queue_lifetime_is_clamped(tmp_path: Path) -> None:
    """bounce_queue_lifetime never exceeds maximal_queue_lifetime (clamped at lookup)."""
    cfg = load(tmp_path, "maximal_queue_lifetime = 1d\nbounce_queue_lifetime = 3d\n")
    assert cfg.get_time("bounce_queue_lifetime") == 86400
    assert cfg.get_str("bounce_queue_lifetime") == "3d"
    cfg = load(tmp_path, "bounce_queue_lifetime = 12h\n")
    assert cfg.get_time("bounce_queue_lifetime") == 12 * 3600


def test_wrong_getter_or_unknown_name_is_a_bug(tmp_path: Path) -> None:
    """Asking for an undeclared name, or with the wrong type, raises InvariantError."""
    cfg = load(tmp_path, "")
    with pytest.raises(InvariantError, match="unknown configuration parameter: nosuch"):
        cfg.get_str("nosuch")
    with pytest.raises(InvariantError, match="is a time, not a int"):
        cfg.get_int("smtp_connect_timeout")
    with pytest.raises(InvariantError, match="is a int, not a bool"):
        cfg.get_bool("smtp_mx_address_limit")
    with pytest.raises(InvariantError):
        cfg.get_list("myhostname")
    with pytest.raises(InvariantError):
        cfg.get_time("soft_bounce")


def test_paths_are_relative_to_the_config_dir(tmp_path: Path) -> None:
    """Relative paths resolve against the configuration directory; empty paths are optional."""
    cfg = load(tmp_path, "queue_directory = ../spool\nsmtp_tls_CAfile = /etc/ssl/ca.pem\n")
    assert cfg.get_path("queue_directory") == tmp_path.parent / "spool"
    assert cfg.get_path("smtp_tls_CAfile") == Path("/etc/ssl/ca.pem")
    assert cfg.get_optional_path("maillog_file") is None
    with pytest.raises(ConfigError, match="maillog_file is empty"):
        cfg.get_path("maillog_file")
    cfg = load(tmp_path, "maillog_file = log/maillog\n")
    assert cfg.get_optional_path("maillog_file") == tmp_path / "log" / "maillog"


def test_empty_queue_directory_is_an_error(tmp_path: Path) -> None:
    """queue_directory must not be empty: the error names the line."""
    message = load_error(tmp_path, "\nqueue_directory =\n")
    assert message.endswith("main.cf, line 2: parameter queue_directory: must not be empty")


def test_config_is_frozen(tmp_path: Path) -> None:
    """Config cannot be modified after loading; reload builds a new one."""
    cfg = load(tmp_path, "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        frozen: Any = cfg  # the assignment mypy would refuse is the point of the test
        frozen.config_dir = Path("/")


# --- transports ---


def test_master_entries(tmp_path: Path) -> None:
    """Non-inet services are the transports; maxproc '-' is default_process_limit."""
    cfg = load(
        tmp_path,
        "default_process_limit = 40\n",
        MASTER + "slow unix - - n - 3 smtp -o smtp_connect_timeout=5s\n",
    )
    assert list(cfg.master) == ["smtp", "relay", "local", "slow"]
    assert cfg.master["smtp"].maxproc == 40
    assert cfg.master["slow"].maxproc == 3
    assert cfg.master["slow"].overrides == {"smtp_connect_timeout": "5s"}
    assert cfg.master["local"].command == "local"
    assert [(e.name, e.command) for e in cfg.inet_services] == [("smtp", "smtpd")]


def test_transport_override_chain(tmp_path: Path) -> None:
    """<t>_param wins over default_param, which wins over the table default."""
    cfg = load(
        tmp_path,
        "relay_destination_concurrency_limit = 7\ndefault_destination_recipient_limit = 30\n",
    )
    relay, smtp = cfg.transport("relay"), cfg.transport("smtp")
    assert relay.get_int("destination_concurrency_limit") == 7
    assert smtp.get_int("destination_concurrency_limit") == 20
    assert relay.get_int("destination_recipient_limit") == 30
    assert relay.get_int("relay_destination_concurrency_limit") == 7
    assert cfg.get_int("relay_destination_concurrency_limit") == 7
    assert cfg.get_int("smtp_destination_concurrency_limit") == 20
    assert cfg.get_int("default_destination_concurrency_limit") == 20


def test_initial_destination_concurrency_override(tmp_path: Path) -> None:
    """<t>_initial_destination_concurrency falls back to the bare name."""
    cfg = load(
        tmp_path, "initial_destination_concurrency = 3\nrelay_initial_destination_concurrency = 9\n"
    )
    assert cfg.transport("relay").get_int("initial_destination_concurrency") == 9
    assert cfg.transport("smtp").get_int("initial_destination_concurrency") == 3


def test_local_limits_are_declared(tmp_path: Path) -> None:
    """local_destination_* have their own defaults (2 and 1), not default_'s."""
    cfg = load(tmp_path, "default_destination_concurrency_limit = 50\n")
    local = cfg.transport("local")
    assert local.get_int("destination_concurrency_limit") == 2
    assert local.get_int("destination_recipient_limit") == 1
    assert cfg.transport("smtp").get_int("destination_concurrency_limit") == 50


def test_o_overrides_come_first_and_expand_in_the_view(tmp_path: Path) -> None:
    """-o settings beat main.cf for that service only, and $names in them see the -o values."""
    master = MASTER + (
        "fast unix - - n - - smtp -o myhostname=fast.example -o smtp_helo_name=helo.$myhostname\n"
        "  -o { default_destination_concurrency_limit = 3 }\n"
        "  -o fast_transport_rate_delay=2s\n"
    )
    cfg = load(
        tmp_path, "fast_destination_concurrency_limit = 8\nmyhostname = main.example\n", master
    )
    fast = cfg.transport("fast")
    assert fast.get_str("smtp_helo_name") == "helo.fast.example"
    assert fast.get_int("destination_concurrency_limit") == 3
    assert fast.get_time("transport_rate_delay") == 2
    assert fast.get_str("mail_name") == "qmgrd"
    assert cfg.get_str("smtp_helo_name") == "main.example"
    assert cfg.transport("smtp").get_str("smtp_helo_name") == "main.example"
    assert cfg.get_int("fast_destination_concurrency_limit") == 8


def test_o_process_limit_resolves_maxproc(tmp_path: Path) -> None:
    """A service's -o default_process_limit is what its '-' maxproc means."""
    cfg = load(tmp_path, "", MASTER + "x unix - - n - - smtp -o default_process_limit=4\n")
    assert cfg.master["x"].maxproc == 4
    assert cfg.master["relay"].maxproc == 100


def test_unknown_transport(tmp_path: Path) -> None:
    """A transport that master.cf does not define is a ConfigError naming master.cf."""
    cfg = load(tmp_path, "")
    with pytest.raises(ConfigError, match=r"master\.cf: no service named 'nosuch'"):
        cfg.transport("nosuch")
    with pytest.raises(InvariantError):
        cfg.get_int("nosuch_destination_concurrency_limit")


# --- value errors ---


@pytest.mark.parametrize(
    ("main", "message"),
    [
        (
            "\nqmgr_message_active_limit = lots\n",
            "main.cf, line 2: parameter qmgr_message_active_limit: bad value 'lots': "
            "expected an integer",
        ),
        (
            "soft_bounce = maybe\n",
            "main.cf, line 1: parameter soft_bounce: bad value 'maybe': expected yes or no",
        ),
        (
            "minimal_backoff_time = 5 minutes\n",
            "main.cf, line 1: parameter minimal_backoff_time: bad value '5 minutes': "
            "expected a time",
        ),
        (
            "default_delivery_slot_discount = 150\n",
            "main.cf, line 1: parameter default_delivery_slot_discount: bad value '150': "
            "must be at most 100",
        ),
        (
            "initial_destination_concurrency = 0\n",
            "main.cf, line 1: parameter initial_destination_concurrency: bad value '0': "
            "must be at least 1",
        ),
        (
            "smtp_tls_security_level = dane\n",
            "main.cf, line 1: parameter smtp_tls_security_level: bad value 'dane': expected one of",
        ),
        (
            "smtpd_listen = 127.0.0.1\n",
            "main.cf, line 1: parameter smtpd_listen: bad value '127.0.0.1': expected host:port",
        ),
        ("log_format = xml\n", "main.cf, line 1: parameter log_format: bad value 'xml'"),
        (
            "limit = 9x\nmessage_size_limit = $limit\n",
            "main.cf, line 2: parameter message_size_limit: bad value '$limit' "
            "(expands to '9x'): expected an integer",
        ),
        (
            "relay_destination_concurrency_limit = -1\n",
            "main.cf, line 1: parameter relay_destination_concurrency_limit: bad value '-1': "
            "must be at least 0",
        ),
        (
            "relay_recipient_refill_delay = soon\n",
            "main.cf, line 1: parameter relay_recipient_refill_delay: bad value 'soon'",
        ),
        (
            "maximal_queue_lifetime = 101d\n",
            "main.cf, line 1: parameter maximal_queue_lifetime: bad value '101d': "
            "must be at most 8640000s",
        ),
    ],
)
def test_value_errors_name_file_line_and_parameter(tmp_path: Path, main: str, message: str) -> None:
    """A bad value is a ConfigError with the file, the line, the parameter and the reason."""
    error = load_error(tmp_path, main)
    assert error.startswith(str(tmp_path / "main.cf"))
    assert message in error


def test_first_bad_line_is_reported(tmp_path: Path) -> None:
    """With several bad values, the error is about the first in file order."""
    error = load_error(tmp_path, "soft_bounce = x\nqmgr_message_active_limit = y\n")
    assert "line 1: parameter soft_bounce" in error


def test_bad_o_value_names_master_cf_line(tmp_path: Path) -> None:
    """A bad -o value names master.cf, the service's line and the parameter."""
    error = load_error(
        tmp_path, "", MASTER + "\nx unix - - n - - smtp -o smtp_mx_session_limit=two\n"
    )
    assert error.startswith(f"{tmp_path / 'master.cf'}, line 6: parameter smtp_mx_session_limit")
    assert "bad value 'two'" in error


def test_bad_default_through_o_names_the_o(tmp_path: Path) -> None:
    """A -o default_ value that breaks a transport's inherited value is reported at its line."""
    error = load_error(
        tmp_path, "", MASTER + "x unix - - n - - smtp -o default_delivery_slot_loan=-2\n"
    )
    assert "master.cf, line 5: parameter default_delivery_slot_loan: bad value '-2'" in error


def test_missing_files(tmp_path: Path) -> None:
    """A missing main.cf or master.cf is a ConfigError naming the file."""
    with pytest.raises(ConfigError, match=r"main\.cf: file not found"):
        load_config(tmp_path)
    (tmp_path / "main.cf").write_text("")
    with pytest.raises(ConfigError, match=r"master\.cf: file not found"):
        load_config(tmp_path)


# --- warnings ---


def test_unknown_names_are_warnings(tmp_path: Path) -> None:
    """Unknown names in main.cf and -o are warned about, with file and line, not rejected."""
    cfg = load(
        tmp_path,
        "myhostnam = typo\nnosvc_destination_concurrency_limit = 3\n"
        "relay_destination_concurrency_limit = 3\n",
        MASTER + "x unix - - n - - smtp -o smtp_bogus=1\n",
    )
    assert cfg.warnings == (
        f"{tmp_path / 'main.cf'}, line 1: unused parameter: myhostnam=typo",
        f"{tmp_path / 'main.cf'}, line 2: unused parameter: nosvc_destination_concurrency_limit=3",
        f"{tmp_path / 'master.cf'}, line 5: unused parameter: smtp_bogus=1",
    )


def test_referenced_user_names_are_not_warned(tmp_path: Path) -> None:
    """A user-defined name used by another value ($name) is not unused."""
    cfg = load(
        tmp_path, "mydest = a.example\nrelayhost = [$mydest]\ncond = x\nmail_name = ${cond?y}\n"
    )
    assert cfg.warnings == ()
    assert cfg.get_str("relayhost") == "[a.example]"
    assert cfg.get_str("mydest") == "a.example"


# --- the repository's example configuration ---


def test_repo_config_loads_cleanly() -> None:
    """config/ in the checkout loads without warnings and defines the required transports."""
    cfg = load_config(REPO_CONFIG, hostname="dev.example")
    assert cfg.warnings == ()
    assert cfg.get_path("queue_directory") == REPO_CONFIG.parent / "spool"
    assert cfg.get_hostports("smtpd_listen") == (("127.0.0.1", 10025),)
    assert cfg.get_str("myhostname") == "localhost"
    assert cfg.get_list("mynetworks") == ("127.0.0.0/8", "[::1]/128")
    assert {"smtp", "relay", "discard", "error", "retry"} <= set(cfg.master)
    assert cfg.master["relay"].command == "smtp"
    assert cfg.master["smtp"].command == "smtp"
    assert cfg.master["retry"].maxproc == 100
