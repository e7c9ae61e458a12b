"""qmgrd postconf -h/-x/-e/-#/-M, --version, -c after the subcommand, closed pipes, postmap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qmgrd.cli import VERSION, main

REPO = Path(__file__).resolve().parents[2]
MASTER = """\
# services
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
  -o smtp_helo_name=relay.example
"""
MAIN = """\
# Identity
myhostname = mx.example
relayhost = [$myhostname]:587
# a comment that must survive edits
qmgr_message_active_limit =
    5000
"""


@pytest.fixture
def conf(tmp_path: Path) -> Path:
    (tmp_path / "main.cf").write_text(MAIN)
    (tmp_path / "master.cf").write_text(MASTER)
    return tmp_path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_value_only(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-h prints the value alone, for $(qmgrd postconf -h myhostname) in scripts."""
    assert run(capsys, "-c", str(conf), "postconf", "-h", "myhostname") == (0, "mx.example\n", "")


def test_config_dir_after_the_subcommand(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-c DIR is accepted after the subcommand, as Postfix's tools take it."""
    assert run(capsys, "postconf", "-c", str(conf), "-h", "myhostname")[1] == "mx.example\n"


def test_expand(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-x expands $name references; without it the value is shown as written."""
    _code, raw, _err = run(capsys, "-c", str(conf), "postconf", "relayhost")
    _code, expanded, _err = run(capsys, "-c", str(conf), "postconf", "-x", "relayhost")
    assert (raw, expanded) == ("relayhost = [$myhostname]:587\n", "relayhost = [mx.example]:587\n")


def test_edit_keeps_comments_and_replaces_continued_lines(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-e replaces a setting with its continuation lines, appends new ones, keeps comments."""
    code, out, err = run(
        capsys,
        "-c",
        str(conf),
        "postconf",
        "-e",
        "qmgr_message_active_limit=100",
        "soft_bounce = yes",
    )
    assert (code, out, err) == (0, "", "")
    assert (conf / "main.cf").read_text() == (
        "# Identity\nmyhostname = mx.example\nrelayhost = [$myhostname]:587\n"
        "# a comment that must survive edits\nqmgr_message_active_limit = 100\n"
        "soft_bounce = yes\n"
    )
    assert run(capsys, "-c", str(conf), "postconf", "-h", "soft_bounce")[1] == "yes\n"


def test_edit_with_a_bad_value_changes_nothing(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-e validates the whole result first: a bad value is refused and main.cf stays as it was."""
    code, out, err = run(capsys, "-c", str(conf), "postconf", "-e", "soft_bounce=maybe")
    assert (code, out) == (1, "")
    assert err == (
        f"qmgrd: fatal: {conf / 'main.cf'}, line 7: parameter soft_bounce: bad value 'maybe': "
        "expected yes or no, got 'maybe'\n"
    )
    assert (conf / "main.cf").read_text() == MAIN
    assert [p.name for p in conf.iterdir() if p.name.startswith(".main.cf")] == []


def test_edit_refuses_a_postfix_parameter_qmgrd_cannot_honour(
    conf: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """-e body_checks=... is refused as the daemon would refuse it."""
    code, _out, err = run(capsys, "-c", str(conf), "postconf", "-e", "body_checks=pcre:/x")
    assert code == 1 and "parameter body_checks: qmgrd does not implement" in err
    assert (conf / "main.cf").read_text() == MAIN


def test_edit_bad_assignment(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-e without '=' is an error saying what is expected."""
    assert run(capsys, "-c", str(conf), "postconf", "-e", "soft_bounce")[2] == (
        "qmgrd: fatal: bad parameter assignment 'soft_bounce': expected name=value\n"
    )


def test_comment_out(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-# comments out every physical line of the setting, so it reverts to its default."""
    assert run(capsys, "-c", str(conf), "postconf", "-#", "qmgr_message_active_limit")[0] == 0
    assert (conf / "main.cf").read_text().endswith(
        "#qmgr_message_active_limit =\n#    5000\n"
    )
    _c, out, _e = run(capsys, "-c", str(conf), "postconf", "-h", "qmgr_message_active_limit")
    assert out == "20000\n"


def test_edit_keeps_the_file_mode(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The rewritten main.cf keeps its permissions."""
    os.chmod(conf / "main.cf", 0o640)
    run(capsys, "-c", str(conf), "postconf", "-e", "soft_bounce=yes")
    assert os.stat(conf / "main.cf").st_mode & 0o777 == 0o640


def test_master_entries(conf: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-M prints master.cf entries in postconf's columns; a service name selects one."""
    code, out, _err = run(capsys, "-c", str(conf), "postconf", "-M", "relay/unix")
    assert code == 0
    assert out == (
        "relay      unix  -       -       n       -       -       smtp -o "
        "smtp_helo_name=relay.example\n"
    )
    assert len(run(capsys, "-c", str(conf), "postconf", "-M")[1].splitlines()) == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the version and exits 0."""
    assert run(capsys, "--version") == (0, f"qmgrd {VERSION}\n", "")


def test_closed_pipe_gives_no_traceback(conf: Path) -> None:
    """qmgrd postconf | head -1: the closed pipe ends the command quietly, without a traceback."""
    # 200 kB of output, more than a pipe holds, so the write after the close fails for sure.
    big = "a" * 200_000
    (conf / "main.cf").write_text(f"{MAIN}big = {big}\nmail_name = ${{big?qmgrd}}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "qmgrd", "-c", str(conf), "postconf"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()  # the reader goes away after the first bytes
    err = proc.stderr.read()
    proc.stderr.close()
    code = proc.wait(30)
    assert b"Traceback" not in err and b"Exception" not in err, err
    assert code == 141


def test_mailq_on_a_missing_spool_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """mailq against a spool that does not exist says so with exit 1 (not 'Mail queue is empty')."""
    (tmp_path / "main.cf").write_text("queue_directory = nowhere\n")
    (tmp_path / "master.cf").write_text(MASTER)
    code, out, err = run(capsys, "-c", str(tmp_path), "mailq")
    assert (code, out) == (1, "")
    assert err == f"qmgrd: fatal: queue directory {tmp_path / 'nowhere'} does not exist\n"


def test_postmap_builds_and_queries(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """qmgrd postmap FILE builds the index; -q looks a key up (exit 1 when absent)."""
    source = tmp_path / "transport"
    source.write_text("example.com relay:[mx.example]\nexample.com dup:\n")
    code, out, err = run(capsys, "postmap", f"hash:{source}")
    assert (code, out) == (0, "")
    assert err == f"qmgrd: warning: {source}, line 2: duplicate entry: 'example.com' (ignored)\n"
    assert run(capsys, "postmap", "-q", "EXAMPLE.com", f"hash:{source}") == (
        0,
        "relay:[mx.example]\n",
        "",
    )
    assert run(capsys, "postmap", "-q", "other", f"lmdb:{source}")[0] == 1


def test_postmap_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """postmap of a malformed source or an unindexed type fails with a clear message."""
    source = tmp_path / "t"
    source.write_text("lonely\n")
    assert run(capsys, "postmap", str(source))[2] == (
        f"qmgrd: fatal: {source}, line 1: expected format: key whitespace value "
        "(the line has a key and no value)\n"
    )
    _code, _out, err = run(capsys, "postmap", f"regexp:{source}")
    assert "postmap builds hash and lmdb tables only" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-e"], "-e needs name=value arguments"),
        (["-#"], "-# needs parameter names"),
        (["-e", "mail_name=a\nb"], "parameter mail_name: the value must be one line"),
    ],
)
def test_edit_usage_errors(
    conf: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    """-e and -# without arguments, or with a multi-line value, change nothing and say why."""
    assert run(capsys, "-c", str(conf), "postconf", *argv) == (1, "", f"qmgrd: fatal: {message}\n")
    assert (conf / "main.cf").read_text() == MAIN


def test_postmap_query_needs_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    """postmap -q with two tables is an error."""
    assert run(capsys, "postmap", "-q", "k", "hash:/a", "hash:/b") == (
        1,
        "",
        "qmgrd: fatal: -q KEY needs exactly one table (type:name)\n",
    )
