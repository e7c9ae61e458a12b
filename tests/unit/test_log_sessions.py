"""smtpd session lines in Postfix's words: connect, disconnect counts, lost connection, SASL.

These tests assert on rendered text on purpose: log tools (fail2ban's stock ``postfix``
filter, pflogsumm) match it with fixed regular expressions.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from qmgrd.log import configure_logging, get_logger
from qmgrd.log.render import render_postfix
from tests.support.logs import saved_structlog

T0 = 1709647629.25


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Each test configures logging globally; put the previous configuration back."""
    with saved_structlog():
        yield


def _line(method: str, event: str, **fields: Any) -> str:
    out = io.StringIO()
    configure_logging("postfix", out)
    getattr(get_logger("smtpd"), method)(event, **fields)
    return out.getvalue().rstrip("\n")


def test_connect_from() -> None:
    """connect renders as Postfix smtpd's ``connect from name[addr]``."""
    assert _line("info", "connect", client="unknown[127.0.0.1]") == (
        "connect from unknown[127.0.0.1]"
    )


def test_disconnect_with_all_commands_successful() -> None:
    """Counts in Postfix's command order, whatever order the caller used, with the total."""
    line = _line(
        "info",
        "disconnect",
        client="unknown[127.0.0.1]",
        commands={"quit": 1, "data": 1, "rcpt": 1, "mail": 1, "ehlo": 1},
    )
    assert line == (
        "disconnect from unknown[127.0.0.1] ehlo=1 mail=1 rcpt=1 data=1 quit=1 commands=5"
    )


def test_disconnect_with_failed_commands_uses_ok_slash_total() -> None:
    """A command that failed some of the time is ok/total, and so is the total."""
    line = _line(
        "info",
        "disconnect",
        client="unknown[192.0.2.2]",
        commands={"ehlo": (1, 1), "auth": (0, 1), "rset": [1, 1], "quit": 1, "unknown": (0, 2)},
    )
    assert line == (
        "disconnect from unknown[192.0.2.2] ehlo=1 auth=0/1 rset=1 quit=1 unknown=0/2 "
        "commands=3/6"
    )


def test_disconnect_without_commands() -> None:
    """A client that sent nothing: ``commands=0``, as Postfix logs it."""
    assert _line("info", "disconnect", client="unknown[127.0.0.1]", commands={}) == (
        "disconnect from unknown[127.0.0.1] commands=0"
    )


def test_disconnect_counts_are_in_the_json_format_too() -> None:
    """The JSON line keeps the counts as data."""
    out = io.StringIO()
    configure_logging("json", out, clock=lambda: T0)
    get_logger("smtpd").info(
        "disconnect", client="unknown[127.0.0.1]", commands={"ehlo": 1, "rcpt": (0, 1)}
    )
    assert '"commands": {"ehlo": 1, "rcpt": [0, 1]}' in out.getvalue()


@pytest.mark.parametrize(
    ("event", "fields", "text"),
    [
        (
            "lost connection",
            {"after": "DATA", "bytes": 1234},
            "lost connection after DATA (1234 bytes) from unknown[127.0.0.1]",
        ),
        ("timeout", {"after": "RCPT"}, "timeout after RCPT from unknown[127.0.0.1]"),
        (
            "too many errors",
            {"after": "EHLO"},
            "too many errors after EHLO from unknown[127.0.0.1]",
        ),
    ],
)
def test_session_end_lines(event: str, fields: dict[str, Any], text: str) -> None:
    """Abnormal session ends read ``<what> after <command> from name[addr]``."""
    assert _line("info", event, client="unknown[127.0.0.1]", **fields) == text


def test_sasl_failure_in_postfix_words() -> None:
    """A SASL failure is Postfix 3.7's warning, user name last."""
    line = _line(
        "warning",
        "SASL authentication failed",
        client="unknown[127.0.0.2]",
        sasl_method="LOGIN",
        sasl_username="bob",
        reason="authentication failure",
    )
    assert line == (
        "warning: unknown[127.0.0.2]: SASL LOGIN authentication failed: "
        "authentication failure, sasl_username=bob"
    )


def test_sasl_failure_escapes_and_truncates_the_user_name() -> None:
    """A user name from the network cannot break the line and is cut at 100 characters."""
    line = _line(
        "warning",
        "SASL authentication failed",
        client="unknown[127.0.0.2]",
        sasl_method="PLAIN",
        sasl_username="x\r\n" + "y" * 200,
    )
    assert "\n" not in line
    assert line.endswith("authentication failure, sasl_username=x\\r\\n" + "y" * 97)


def test_sasl_aborted() -> None:
    """A client giving up with ``*`` is Postfix's ``authentication aborted`` warning."""
    line = _line(
        "warning", "SASL authentication aborted", client="unknown[127.0.0.2]", sasl_method="LOGIN"
    )
    assert line == "warning: unknown[127.0.0.2]: SASL LOGIN authentication aborted"


def test_session_shapes_need_their_fields() -> None:
    """Without a client (or with a queue id) the generic rendering is used, not a half shape."""
    assert render_postfix({"event": "connect", "level": "info"}) == "connect"
    assert render_postfix({"event": "disconnect", "queue_id": "ABC", "client": "c[1]"}) == (
        "ABC: client=c[1]"
    )


# fail2ban 1.0.2's stock filter.d/postfix.conf, "auth" mode (mdpr-auth + mdre-auth), with
# <HOST> spelled as a named group and the inline (?i) scoped as Python requires.
F2B_AUTH = re.compile(
    r"warning: [^[]*\[(?P<host>[^\]]+)\](?::\d+)?: SASL (?i:LOGIN|PLAIN|(?:CRAM|DIGEST)-MD5) "
    r"authentication failed:(?! Connection lost to authentication server| Invalid "
    r"authentication mechanism)"
)
# the "normal" mode's relay-denied rule (mdpr-normal + mdre-normal), abridged to that case.
F2B_REJECT = re.compile(
    r"\w+: reject: [A-Z]{4} from [^[]*\[(?P<host>[^\]]+)\](?::\d+)?: [45][50][04] "
    r"[45]\.\d\.\d+ (?:(?:<[^>]*>)?: )?Relay access denied\b"
)
# the "ddos" mode's disconnect rule: failed AUTH counted on the disconnect line.
F2B_DDOS = re.compile(
    r"disconnect(?= from \S+(?: \S+=\d+)* auth=0/(?:[1-9]|\d\d+)) from [^[]*\[(?P<host>[^\]]+)\]"
)


def test_fail2ban_stock_expressions_match() -> None:
    """fail2ban's stock postfix expressions find the client address in our lines."""
    sasl = _line(
        "warning",
        "SASL authentication failed",
        client="unknown[192.0.2.9]",
        sasl_method="LOGIN",
        sasl_username="bob",
    )
    assert (m := F2B_AUTH.match(sasl)) and m["host"] == "192.0.2.9"
    reject = _line(
        "info",
        "NOQUEUE: reject",
        stage="RCPT",
        client="unknown[192.0.2.10]",
        code="554 5.7.1",
        reason="Relay access denied",
        to="<x@example.org>",
        from_="<a@example.com>",
    )
    assert (m := F2B_REJECT.match(reject)) and m["host"] == "192.0.2.10"
    bye = _line(
        "info", "disconnect", client="unknown[192.0.2.11]", commands={"ehlo": 1, "auth": (0, 3)}
    )
    assert (m := F2B_DDOS.match(bye)) and m["host"] == "192.0.2.11"


@pytest.mark.skipif(shutil.which("fail2ban-regex") is None, reason="fail2ban is not installed")
@pytest.mark.skipif(
    not Path("/etc/fail2ban/filter.d/postfix.conf").exists(), reason="no stock postfix filter"
)
def test_fail2ban_regex_with_the_installed_stock_filter(tmp_path: Path) -> None:
    """The installed fail2ban finds every offending client in a qmgrd maillog."""
    log = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=log, hostname="mx", clock=lambda: T0)
    smtpd = get_logger("smtpd")
    smtpd.info("connect", client="unknown[192.0.2.20]")
    smtpd.warning(
        "SASL authentication failed",
        client="unknown[192.0.2.20]",
        sasl_method="PLAIN",
        sasl_username="admin",
    )
    smtpd.info(
        "NOQUEUE: reject",
        stage="RCPT",
        client="unknown[192.0.2.21]",
        code="554 5.7.1",
        reason="Relay access denied",
        to="<x@example.org>",
        from_="<a@example.com>",
        proto="ESMTP",
        helo="<h>",
    )
    smtpd.info("disconnect", client="unknown[192.0.2.20]", commands={"ehlo": 1, "auth": (0, 1)})
    structlog.get_config()["logger_factory"].close()
    # The stock filter expects "postfix/..." program names: a jail for qmgrd overrides _daemon.
    result = subprocess.run(
        [
            "fail2ban-regex",
            "--print-all-matched",
            str(log),
            r'postfix[mode=aggressive, _daemon="qmgrd/\w+"]',
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert re.search(r"^Lines: 4 lines, 0 ignored, 3 matched, 1 missed", result.stdout, re.M)


def test_command_counts_feed_the_disconnect_line() -> None:
    """Counts recorded per command render as Postfix's disconnect, unknown commands last."""
    from qmgrd.log.session import CommandCounts

    counts = CommandCounts()
    for command, ok in [
        ("EHLO", True),
        ("AUTH", False),
        ("XYZZY", False),
        ("MAIL", True),
        ("RCPT", True),
        ("RCPT", False),
        ("DATA", True),
        ("QUIT", True),
    ]:
        counts.record(command, ok)
    line = _line("info", "disconnect", client="unknown[127.0.0.1]", commands=counts.as_field())
    assert line == (
        "disconnect from unknown[127.0.0.1] ehlo=1 auth=0/1 mail=1 rcpt=1/2 data=1 quit=1 "
        "unknown=0/1 commands=5/8"
    )
