"""The sendmail command as a process: each option and error exit, as cron and PHP call it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qmgrd.sendmail.maildrop import read_maildrop
from tests.integration.e2e import write_config

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30


def make_conf(tmp_path: Path, main: str = "") -> Path:
    conf = write_config(tmp_path, main="myorigin = origin.test\n" + main)
    (tmp_path / "spool" / "maildrop").mkdir(parents=True)
    return conf


def sendmail(
    conf: Path, *args: str, stdin: bytes = b"Subject: s\n\nbody\n", program: str = "sendmail"
) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "MAIL_CONFIG": str(conf), "PYTHONPATH": str(REPO)}
    if program == "qmgrd":
        argv = [sys.executable, "-m", "qmgrd", "-c", str(conf), "sendmail", *args]
    else:
        argv = [sys.executable, "-m", "qmgrd.sendmail", *args]
    return subprocess.run(
        argv, input=stdin, capture_output=True, env=env, cwd=REPO, timeout=TIMEOUT, check=False
    )


def dropped(tmp_path: Path) -> list[tuple[str, tuple[str, ...], bytes, str]]:
    found = []
    for path in sorted((tmp_path / "spool" / "maildrop").iterdir()):
        if path.name.startswith("."):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            m = read_maildrop(fd, 10_000_000)
        finally:
            os.close(fd)
        found.append((m.sender, m.recipients, m.content, m.full_name))
    return found


def test_cron_invocation(tmp_path: Path) -> None:
    """cron: sendmail -FCronDaemon -i -B8BITMIME -oem user: exit 0, full name kept."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "-FCronDaemon", "-i", "-B8BITMIME", "-oem", "root")
    assert proc.returncode == 0, proc.stderr
    [(sender, rcpts, content, name)] = dropped(tmp_path)
    assert rcpts == ("root",) and name == "CronDaemon" and content.endswith(b"body\n")
    assert sender  # the login name; pickup qualifies it with myorigin


def test_php_mail_invocation(tmp_path: Path) -> None:
    """PHP mail(): sendmail -t -i -f sender, recipients from To/Cc/Bcc."""
    conf = make_conf(tmp_path)
    msg = b"To: a@x.test, B <b@x.test>\nCc: c@x.test\nBcc: d@x.test\nSubject: php\n\nhi\n"
    proc = sendmail(conf, "-t", "-i", "-f", "web@site.test", stdin=msg)
    assert proc.returncode == 0, proc.stderr
    [(sender, rcpts, _content, _)] = dropped(tmp_path)
    assert sender == "web@site.test"
    assert rcpts == ("a@x.test", "b@x.test", "c@x.test", "d@x.test")


def test_t_adds_command_line_recipients(tmp_path: Path) -> None:
    """-t with arguments: both sets of recipients (Postfix 2.1+)."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "-t", "extra@x.test", stdin=b"To: a@x.test\n\nhi\n")
    assert proc.returncode == 0
    assert dropped(tmp_path)[0][1] == ("extra@x.test", "a@x.test")


def test_dot_ends_input_without_i(tmp_path: Path) -> None:
    """Without -i a line with a single dot ends the message; a leading From_ line is dropped."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "a@x.test", stdin=b"From someone Mon\nSubject: s\n\nbody\n.\nafter\n")
    assert proc.returncode == 0
    assert dropped(tmp_path)[0][2] == b"Subject: s\n\nbody\n"


def test_qmgrd_sendmail_subcommand_and_null_sender(tmp_path: Path) -> None:
    """qmgrd -c DIR sendmail -f '<>' works like the console script."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "-f", "<>", "a@x.test", program="qmgrd")
    assert proc.returncode == 0, proc.stderr
    assert dropped(tmp_path)[0][0] == ""


def test_ignored_options_are_accepted(tmp_path: Path) -> None:
    """Options Postfix ignores (-m -n -x -U -G -oem -O x=y -h 5 -L lab -q1h) are accepted."""
    conf = make_conf(tmp_path)
    proc = sendmail(
        conf,
        "-m",
        "-n",
        "-x",
        "-U",
        "-G",
        "-oem",
        "-Ox=y",
        "-h",
        "5",
        "-L",
        "lab",
        "-N",
        "failure,delay",
        "-R",
        "hdrs",
        "-V",
        "env1",
        "a@x.test",
    )
    assert proc.returncode == 0, proc.stderr
    assert sendmail(conf, "-q1h").returncode == 0


@pytest.mark.parametrize(
    ("args", "stdin", "code", "text"),
    [
        ((), b"Subject: s\n\n", 64, b"Recipient addresses must be specified"),
        (("-t",), b"Subject: no rcpt\n\n", 64, b"No recipient addresses found"),
        (("-z", "a@x.test"), b"", 64, b"invalid option"),
        (("-f",), b"", 64, b"requires an argument"),
        (("-bz",), b"", 64, b"unsupported: -bz"),
        (("-N", "sometimes", "a@x"), b"", 64, b"bad -N value"),
        (("-q",), b"", 69, b"Cannot flush mail queue"),
        (("-bd",), b"", 69, b"unsupported: -bd"),
    ],
)
def test_error_exits(
    tmp_path: Path, args: tuple[str, ...], stdin: bytes, code: int, text: bytes
) -> None:
    """Each error has its sysexits code and one line on stderr, no traceback."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, *args, stdin=stdin)
    assert proc.returncode == code
    assert text in proc.stderr
    assert b"Traceback" not in proc.stderr


def test_message_too_big_is_dataerr(tmp_path: Path) -> None:
    """A message over message_size_limit exits EX_DATAERR (65) and leaves nothing."""
    conf = make_conf(tmp_path, "message_size_limit = 1000\n")
    proc = sendmail(conf, "-i", "a@x.test", stdin=b"Subject: s\n\n" + b"x" * 2000 + b"\n")
    assert proc.returncode == 65 and b"too big" in proc.stderr
    assert dropped(tmp_path) == []


def test_unwritable_maildrop_is_tempfail(tmp_path: Path) -> None:
    """No maildrop directory (or no permission) exits EX_TEMPFAIL (75): try again later."""
    conf = make_conf(tmp_path)
    (tmp_path / "spool" / "maildrop").rmdir()
    proc = sendmail(conf, "a@x.test")
    assert proc.returncode == 75 and b"maildrop" in proc.stderr


def test_bad_config_is_ex_config(tmp_path: Path) -> None:
    """A configuration that cannot be read exits EX_CONFIG (78)."""
    conf = make_conf(tmp_path, "message_size_limit = lots\n")
    proc = sendmail(conf, "a@x.test")
    assert proc.returncode == 78 and b"message_size_limit" in proc.stderr


def test_bp_lists_the_queue(tmp_path: Path) -> None:
    """-bp is mailq."""
    conf = make_conf(tmp_path)
    (tmp_path / "spool" / "incoming").mkdir()
    proc = sendmail(conf, "-bp")
    assert proc.returncode == 0 and b"Mail queue is empty" in proc.stdout


def test_bv_reports_rewritten_addresses(tmp_path: Path) -> None:
    """-bv prints each recipient as it would be accepted (qualified with myorigin)."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "-bv", "root")
    assert proc.returncode == 0
    assert b"<root>: deliverable as <root@origin.test>" in proc.stdout


def test_v_says_where_the_mail_is(tmp_path: Path) -> None:
    """-v tells the queue id and that the daemon is not running."""
    conf = make_conf(tmp_path)
    proc = sendmail(conf, "-v", "a@x.test")
    assert proc.returncode == 0 and b"waiting in maildrop" in proc.stderr


def test_maildrop_directory_parameter(tmp_path: Path) -> None:
    """maildrop_directory moves the maildrop queue (e.g. outside a private spool)."""
    conf = make_conf(tmp_path, f"maildrop_directory = {tmp_path / 'drop'}\n")
    (tmp_path / "drop").mkdir()
    assert sendmail(conf, "a@x.test").returncode == 0
    assert len(list((tmp_path / "drop").iterdir())) == 1
    assert dropped(tmp_path) == []
