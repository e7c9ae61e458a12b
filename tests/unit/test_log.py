"""Log rendering and outputs: Postfix text, syslog prefix, JSON lines, file reopen (rotation).

These tests assert on rendered text on purpose: the rendering is the subject under test.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from qmgrd.errors import ConfigError
from qmgrd.log import (
    configure_logging,
    get_logger,
    render_postfix,
    reopen_logs,
    syslog_prefix,
)
from tests.support.logs import saved_structlog

# 2024-03-05 14:07:09 UTC; the syslog prefix uses local time, computed the same way below.
T0 = 1709647629.25


@pytest.fixture(autouse=True)
def restore_structlog() -> Iterator[None]:
    """Each test configures logging globally; put the previous configuration back."""
    with saved_structlog():
        yield


def _local_stamp(t: float) -> str:
    tm = time.localtime(t)
    months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    return f"{months[tm.tm_mon - 1]} {tm.tm_mday:2d} {time.strftime('%H:%M:%S', tm)}"


def _sent(log: Any, **extra: Any) -> None:
    """A delivery line with fields in a non-Postfix order and an extra transport field."""
    log.info(
        "sent",
        queue_id="4F9D3C2A1B0E7D6",
        status="sent",
        transport="relay",
        dsn="2.0.0",
        to="<a@example.com>",
        delays="0.01/0/0.02/0.03",
        relay="mx.example.com[192.0.2.1]:25",
        delay="0.06",
        reply="250 2.0.0 Ok: queued as X",
        **extra,
    )


def test_recipient_line_has_postfix_field_order() -> None:
    """A recipient outcome renders in Postfix's order, without fields Postfix does not print."""
    out = io.StringIO()
    configure_logging("postfix", out)
    _sent(get_logger("smtp"))
    assert out.getvalue() == (
        "4F9D3C2A1B0E7D6: to=<a@example.com>, relay=mx.example.com[192.0.2.1]:25, "
        "delay=0.06, delays=0.01/0/0.02/0.03, dsn=2.0.0, status=sent (250 2.0.0 Ok: queued as X)\n"
    )


def test_pflogsumm_delivery_expression_matches() -> None:
    """The delivery line matches the expression pflogsumm uses for to=/relay=/delay=/status=."""
    line = render_postfix(
        {
            "event": "deferred",
            "queue_id": "ABC",
            "to": "<b@example.net>",
            "relay": "none",
            "delay": "12",
            "delays": "12/0/0/0",
            "dsn": "4.4.1",
            "status": "deferred",
            "reply": "connect to example.net[192.0.2.2]:25: Connection refused",
            "transport": "smtp",
        }
    )
    pattern = re.compile(
        r"to=<([^>]*)>, (?:orig_to=<[^>]*>, )?relay=([^,]+), (?:conn_use=[^,]+, )?"
        r"delay=([^,]+), (?:delays=[^,]+, )?(?:dsn=[^,]+, )?status=(\S+)(.*)$"
    )
    match = pattern.search(line)
    assert match is not None
    assert match.groups()[:4] == ("b@example.net", "none", "12", "deferred")
    assert match.group(5) == " (connect to example.net[192.0.2.2]:25: Connection refused)"


def test_maillog_file_lines_have_the_syslog_prefix(tmp_path: Path) -> None:
    """Each file line starts with 'Mon DD HH:MM:SS host qmgrd/<component>[pid]: '."""
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: T0)
    log = get_logger("qmgr")
    log.info("removed", queue_id="4F9D3C2A1B0E7D6")
    log.warning("transport dead", transport="smtp", reason="no route")
    structlog.get_logger().info("no component here")
    pid = os.getpid()
    stamp = _local_stamp(T0)
    assert path.read_text().splitlines() == [
        f"{stamp} mx1 qmgrd/qmgr[{pid}]: 4F9D3C2A1B0E7D6: removed",
        f"{stamp} mx1 qmgrd/qmgr[{pid}]: warning: transport dead: transport=smtp, reason=no route",
        f"{stamp} mx1 qmgrd[{pid}]: no component here",
    ]


def test_the_prefix_follows_the_clock_and_the_component(tmp_path: Path) -> None:
    """Each line's prefix has its own second's time stamp and its own component."""
    path = tmp_path / "maillog"
    times = iter([T0, T0 + 0.5, T0 + 1, T0 + 1.2])
    configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: next(times))
    get_logger("qmgr").info("removed", queue_id="A")
    get_logger("smtp").info("removed", queue_id="B")
    get_logger("qmgr").info("removed", queue_id="C")
    get_logger("smtp").info("removed", queue_id="D")
    pid = os.getpid()
    first, later = _local_stamp(T0), _local_stamp(T0 + 1)
    assert path.read_text().splitlines() == [
        f"{first} mx1 qmgrd/qmgr[{pid}]: A: removed",
        f"{first} mx1 qmgrd/smtp[{pid}]: B: removed",
        f"{later} mx1 qmgrd/qmgr[{pid}]: C: removed",
        f"{later} mx1 qmgrd/smtp[{pid}]: D: removed",
    ]


def test_syslog_prefix_pads_the_day_and_uses_english_months() -> None:
    """Days below 10 are space-padded (syslog %e) and the month is the English abbreviation."""
    t = time.mktime((2024, 1, 2, 3, 4, 5, 0, 0, -1))  # local time
    assert syslog_prefix(t, "h", "qmgrd", "smtpd", 42) == "Jan  2 03:04:05 h qmgrd/smtpd[42]: "
    t = time.mktime((2024, 12, 25, 23, 59, 59, 0, 0, -1))
    assert syslog_prefix(t, "h", "p", None, 1) == "Dec 25 23:59:59 h p[1]: "


def test_stream_output_has_no_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    """Without maillog_file and outside systemd, lines go to stdout without a prefix."""
    configure_logging("postfix", environ={}, syslog_socket="/nonexistent/log")
    get_logger("smtpd").info("connect", client="unknown[127.0.0.1]")
    assert capsys.readouterr().out == "connect from unknown[127.0.0.1]\n"


def test_maillog_file_through_a_symlink(tmp_path: Path) -> None:
    """maillog_file may be a symlink (as /dev/stdout is) and the lines land in its target."""
    target = tmp_path / "real"
    link = tmp_path / "stdout"
    link.symlink_to(target)
    configure_logging("postfix", maillog_file=link, hostname="h", clock=lambda: T0)
    get_logger("master").info("daemon started")
    assert target.read_text().endswith(f"h qmgrd/master[{os.getpid()}]: daemon started\n")


def test_network_control_characters_are_escaped(tmp_path: Path) -> None:
    """CR, LF, NUL and C1 characters in a reply or address cannot split or forge a line."""
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="h", clock=lambda: T0)
    forged = "550 no\r\nJan  1 00:00:00 h qmgrd/smtp[1]: X: status=sent\x00\x85"
    get_logger("smtp").info(
        "bounced",
        queue_id="Q",
        to="<a\nb@x>",
        relay="r",
        dsn="5.0.0",
        status="bounced",
        reply=forged,
    )
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert lines[0].endswith(
        "Q: to=<a\\nb@x>, relay=r, dsn=5.0.0, status=bounced "
        "(550 no\\r\\nJan  1 00:00:00 h qmgrd/smtp[1]: X: status=sent\\x00\\x85)"
    )


def test_noqueue_reject_has_the_postfix_shape() -> None:
    """The relay-denied event renders as Postfix's 'NOQUEUE: reject: RCPT from ...' line."""
    line = render_postfix(
        {
            "event": "NOQUEUE: reject",
            "component": "smtpd",
            "stage": "RCPT",
            "client": "unknown[192.0.2.9]",
            "code": "554 5.7.1",
            "reason": "Relay access denied",
            "from_": "<s@example.com>",
            "to": "<r@example.net>",
            "proto": "ESMTP",
        }
    )
    assert line == (
        "NOQUEUE: reject: RCPT from unknown[192.0.2.9]: 554 5.7.1 <r@example.net>: "
        "Relay access denied; from=<s@example.com> to=<r@example.net> proto=ESMTP"
    )


def test_json_lines_have_fixed_keys_and_round_trip(tmp_path: Path) -> None:
    """JSON: one object per line, timestamp/level/component/queue_id/event first, no prefix."""
    path = tmp_path / "maillog.json"
    configure_logging("json", maillog_file=path, clock=lambda: T0)
    _sent(get_logger("smtp"))
    get_logger("smtpd").warning("lost connection", client="c\u2028d\r\n", from_="<x>")
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    assert len(lines) == 3
    first = json.loads(lines[0])
    assert list(first)[:5] == ["timestamp", "level", "component", "queue_id", "event"]
    assert first["timestamp"] == "2024-03-05T14:07:09.250000Z"
    assert first["component"] == "smtp"
    assert first["queue_id"] == "4F9D3C2A1B0E7D6"
    assert first["transport"] == "relay"  # JSON keeps what the text format leaves out
    assert first["reply"] == "250 2.0.0 Ok: queued as X"
    second = json.loads(lines[1])
    assert second["level"] == "warning"
    assert second["queue_id"] is None
    assert second["from"] == "<x>"
    assert second["client"] == "c\u2028d\r\n"
    assert "\u2028" not in lines[1]  # escaped as \u2028, not raw


def test_json_to_stream(capsys: pytest.CaptureFixture[str]) -> None:
    """The JSON format on stdout is the same object per line."""
    configure_logging("json", clock=lambda: T0)
    get_logger("qmgr").info("removed", queue_id="Q1", count=3)
    obj = json.loads(capsys.readouterr().out)
    assert obj == {
        "timestamp": "2024-03-05T14:07:09.250000Z",
        "level": "info",
        "component": "qmgr",
        "queue_id": "Q1",
        "event": "removed",
        "count": 3,
    }


def test_reopen_after_rotation(tmp_path: Path) -> None:
    """After the file is renamed, reopen_logs() makes new lines go to a fresh file."""
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="h", clock=lambda: T0)
    log = get_logger("qmgr")
    log.info("before rotation")
    path.rename(tmp_path / "maillog.1")
    log.info("between rename and reopen")
    assert reopen_logs() is True
    log.info("after rotation")
    old = (tmp_path / "maillog.1").read_text()
    assert "before rotation" in old
    assert "between rename and reopen" in old
    assert path.read_text().endswith("after rotation\n")
    assert "before" not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o640 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_failed_reopen_keeps_the_old_file(tmp_path: Path) -> None:
    """If the path cannot be reopened, logging continues into the old file with a warning."""
    path = tmp_path / "maillog"
    output = configure_logging("postfix", maillog_file=path, hostname="h", clock=lambda: T0)
    path.rename(tmp_path / "maillog.1")
    path.mkdir()  # opening a directory for writing fails (even as root)
    assert output.reopen() is False
    get_logger("qmgr").info("still logging")
    old = (tmp_path / "maillog.1").read_text().splitlines()
    assert "warning: cannot reopen the log file" in old[0]
    assert old[1].endswith("still logging")


def test_reopen_without_a_file_is_a_noop(capsys: pytest.CaptureFixture[str]) -> None:
    """On stdout there is nothing to reopen."""
    configure_logging("postfix", destination="stream")
    assert reopen_logs() is False
    get_logger("qmgr").info("fine")
    assert capsys.readouterr().out == "fine\n"


def test_unopenable_file_is_a_config_error(tmp_path: Path) -> None:
    """A maillog_file in a missing directory is a one-line operator error."""
    with pytest.raises(ConfigError, match=r"^maillog_file: cannot open .*missing/maillog: "):
        configure_logging("postfix", maillog_file=tmp_path / "missing" / "maillog")


def test_unknown_format_is_a_config_error() -> None:
    """log_format must be postfix or json."""
    with pytest.raises(ConfigError, match="log_format"):
        unknown: Any = "xml"  # not a LogFormat: what an operator's typo gives at run time
        configure_logging(unknown)


def test_level_filter_drops_debug(capsys: pytest.CaptureFixture[str]) -> None:
    """At the default INFO level, debug events are not written."""
    configure_logging("postfix", destination="stream")
    get_logger("qmgr").debug("noise")
    get_logger("qmgr").error("cannot scan the deferred queue", error="EIO")
    assert capsys.readouterr().out == "error: cannot scan the deferred queue: error=EIO\n"


def test_exception_is_rendered_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """A logged exception's traceback is escaped into the line, not spread over many."""
    configure_logging("postfix", destination="stream")
    try:
        raise ValueError("boom")
    except ValueError:
        get_logger("qmgr").exception("internal error")
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    assert out.startswith("error: internal error: exception=Traceback")
    assert "ValueError: boom" in out


def test_pflogsumm_reads_the_maillog(tmp_path: Path) -> None:
    """pflogsumm --syslog-name=qmgrd counts received, delivered, deferred, bounced and rejected."""
    tool = shutil.which("pflogsumm")
    if tool is None:
        pytest.skip("pflogsumm is not installed (apt-get install pflogsumm)")
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="mx1")
    smtpd, qmgr, smtp = get_logger("smtpd"), get_logger("qmgr"), get_logger("smtp")
    one, two = "4F9D3C2A1B0E7D6", "4F9D3C2A1B0E7D7"
    smtpd.info("queued", queue_id=one, client="unknown[127.0.0.1]", from_="<s@example.com>")
    qmgr.info("queued", queue_id=one, from_="<s@example.com>", size=1234, nrcpt="2 (queue active)")
    _sent(smtp)
    smtp.info(
        "deferred", queue_id=one, to="<b@example.org>", relay="none", delay="0.5",
        delays="0.1/0/0.4/0", dsn="4.4.1", status="deferred", reply="connect: refused",
    )  # fmt: skip
    smtpd.info("queued", queue_id=two, client="h.example[192.0.2.7]", from_="<t@example.com>")
    qmgr.info("queued", queue_id=two, from_="<t@example.com>", size=99, nrcpt="1 (queue active)")
    smtp.info(
        "bounced", queue_id=two, to="<c@example.net>", relay="mx[192.0.2.1]:25", delay="1",
        delays="0.1/0/0.4/0.5", dsn="5.1.1", status="bounced", reply="550 5.1.1 no such user",
    )  # fmt: skip
    qmgr.info("removed", queue_id=two)
    smtpd.info(
        "NOQUEUE: reject", stage="RCPT", client="unknown[192.0.2.9]", code="554 5.7.1",
        reason="Relay access denied", from_="<x@example.com>", to="<y@example.org>",
    )  # fmt: skip
    proc = subprocess.run(
        [tool, "--syslog-name=qmgrd", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    totals = {
        m.group(2): int(m.group(1))
        for m in re.finditer(r"^\s+(\d+)\s+(received|delivered|deferred|bounced|rejected)\b",
                             proc.stdout, re.MULTILINE)
    }  # fmt: skip
    assert totals == {"received": 2, "delivered": 1, "deferred": 1, "bounced": 1, "rejected": 1}


async def test_lines_logged_on_the_loop_are_written_together_at_the_next_pass(
    tmp_path: Path,
) -> None:
    """maillog_file lines logged on the loop wait for the loop's next pass, then land in
    order; a line logged off the loop is written at once, after them."""
    path = tmp_path / "maillog"
    output = configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: T0)
    log = get_logger("qmgr")
    log.info("removed", queue_id="A1")
    log.info("removed", queue_id="A2")
    assert path.read_text() == ""  # queued: one write at the next pass
    await asyncio.sleep(0)
    assert [line.split(": ", 1)[1] for line in path.read_text().splitlines()] == [
        "A1: removed",
        "A2: removed",
    ]
    log.info("removed", queue_id="A3")
    await asyncio.to_thread(log.info, "removed", queue_id="B1")  # a worker thread
    assert [line.split(": ", 1)[1] for line in path.read_text().splitlines()][2:] == [
        "A3: removed",
        "B1: removed",
    ]
    log.info("removed", queue_id="A4")
    output.close()  # writes what is queued
    assert path.read_text().splitlines()[-1].endswith("A4: removed")


async def test_a_pass_looks_up_its_loop_once_for_all_its_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a flush is due on this thread's running loop, further lines of the pass only
    queue (no get_running_loop: a getpid system call each on Python 3.11); all land in order."""
    path = tmp_path / "maillog"
    output = configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: T0)
    log = get_logger("qmgr")
    lookups = 0
    plain = asyncio.get_running_loop

    def counted() -> asyncio.AbstractEventLoop:
        nonlocal lookups
        lookups += 1
        return plain()

    monkeypatch.setattr(asyncio, "get_running_loop", counted)
    for n in range(5):
        log.info("removed", queue_id=f"D{n}")
    assert lookups == 1
    monkeypatch.undo()
    await asyncio.sleep(0)
    assert [line.split(": ", 1)[1] for line in path.read_text().splitlines()] == [
        f"D{n}: removed" for n in range(5)
    ]
    output.close()


def test_lines_queued_on_a_closed_loop_are_written_by_the_next_line(tmp_path: Path) -> None:
    """A loop that closed before its flush ran does not hold lines back."""
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: T0)
    log = get_logger("qmgr")
    loop = asyncio.new_event_loop()
    loop.call_soon(lambda: log.info("removed", queue_id="C1"))
    loop.call_soon(loop.stop)  # the loop stops before the pass that would flush
    loop.run_forever()
    loop.close()
    assert path.read_text() == ""
    log.info("removed", queue_id="C2")
    assert [line.split(": ", 1)[1] for line in path.read_text().splitlines()] == [
        "C1: removed",
        "C2: removed",
    ]


async def test_a_fork_writes_queued_lines_once(tmp_path: Path) -> None:
    """Lines queued when a worker process is forked are written by the parent before the
    fork, never again by the child."""
    path = tmp_path / "maillog"
    configure_logging("postfix", maillog_file=path, hostname="mx1", clock=lambda: T0)
    log = get_logger("qmgr")
    log.info("removed", queue_id="F1")  # queued for the loop's next pass
    pid = os.fork()
    if pid == 0:  # the child: off its parent's loop, a line is written at once
        try:
            log.info("removed", queue_id="F2")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    await asyncio.sleep(0)
    lines = path.read_text().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "F1: removed",
        "F2: removed",
    ]
    # Each process's lines carry its own pid (the prefix is built once a second).
    assert f" qmgrd/qmgr[{os.getpid()}]: " in lines[0]
    assert f" qmgrd/qmgr[{pid}]: " in lines[1]
