"""qmgrd cat ID (postcat -q): envelope, header, body, section flags, terminal escaping, errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from qmgrd.cli import main
from qmgrd.spool.records import Envelope, RecipientSpec
from qmgrd.spool.store import Spool

MASTER = "smtp unix - - n - - smtp\n"
CONTENT = (
    b"From: a@example.com\r\nSubject: hi \x1b[31mred\r\n\r\nline one\r\n\tindented \xff byte\r\n"
)


@pytest.fixture
def queued(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "main.cf").write_text("queue_directory = spool\n")
    (tmp_path / "master.cf").write_text(MASTER)
    spool = Spool(tmp_path / "spool", fsync=False)
    spool.ensure_dirs()
    envelope = Envelope(
        sender="a@example.com",
        recipients=(
            RecipientSpec(
                "b@example.net", orcpt="rfc822;b@example.net", notify=frozenset({"FAILURE"})
            ),
            RecipientSpec("c\x1b@example.net"),
        ),
        arrival_time=1_700_000_000.0,
        envid="ENV1",
        client_addr="127.0.0.1",
    )
    return tmp_path, spool.commit(envelope, CONTENT)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cat_shows_envelope_header_and_body(
    queued: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Without flags: the envelope records, the content and the section markers."""
    conf, qid = queued
    code, out, err = run(capsys, "-c", str(conf), "cat", qid)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"*** ENVELOPE RECORDS incoming/{qid} ***"
    assert "sender: a@example.com" in lines
    assert "named_attribute: envid=ENV1" in lines
    assert "named_attribute: client_addr=127.0.0.1" in lines
    assert "original_recipient: rfc822;b@example.net" in lines
    assert "notify_flags: FAILURE" in lines
    assert "recipient: b@example.net" in lines
    assert lines[lines.index(f"*** MESSAGE CONTENTS incoming/{qid} ***") + 1] == (
        "From: a@example.com"
    )
    assert lines[-1] == f"*** MESSAGE FILE END incoming/{qid} ***"


def test_cat_escapes_non_printable_bytes(
    queued: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """ESC and invalid UTF-8 reach the terminal escaped; tabs stay."""
    conf, qid = queued
    _code, out, _err = run(capsys, "-c", str(conf), "cat", qid)
    assert "\x1b" not in out
    assert "Subject: hi \\x1b[31mred" in out
    assert "recipient: c\\x1b@example.net" in out
    assert "\tindented \\xff byte" in out


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["-h"], "From: a@example.com\nSubject: hi \\x1b[31mred\n"),
        (["-b"], "line one\n\tindented \\xff byte\n"),
        (
            ["-h", "-b"],
            "From: a@example.com\nSubject: hi \\x1b[31mred\n\nline one\n\tindented \\xff byte\n",
        ),
    ],
)
def test_cat_section_flags(
    queued: tuple[Path, str], capsys: pytest.CaptureFixture[str], flags: list[str], expected: str
) -> None:
    """-h / -b print only those sections, without markers (pipe-friendly)."""
    conf, qid = queued
    assert run(capsys, "-c", str(conf), "cat", *flags, qid) == (0, expected, "")


def test_cat_envelope_only(queued: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """-e prints the envelope records only; -q is accepted as postcat's flag."""
    conf, qid = queued
    code, out, _err = run(capsys, "cat", "-c", str(conf), "-q", "-e", qid)
    assert code == 0
    assert out.splitlines()[0].startswith("message_size:")
    assert "From:" not in out and "***" not in out


def test_cat_errors(queued: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed id, an id not queued and a missing spool are errors with exit 1."""
    conf, _qid = queued
    assert run(capsys, "-c", str(conf), "cat", "not/an\x1bid") == (
        1,
        "",
        "qmgrd: fatal: invalid queue id: not/an\\x1bid\n",
    )
    missing = "0" * len(_qid)
    assert run(capsys, "-c", str(conf), "cat", missing) == (
        1,
        "",
        f"qmgrd: fatal: message {missing} is not in the queue\n",
    )
    (conf / "main.cf").write_text("queue_directory = nowhere\n")
    code, _out, err = run(capsys, "-c", str(conf), "cat", missing)
    assert code == 1 and "does not exist" in err
