"""mailq as Postfix tools read it: postqueue -j's members, pymailq's text parser, forced expiry."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest

from qmgrd.errors import SpoolError
from qmgrd.spool import (
    Envelope,
    QueueIdGenerator,
    ReasonRecord,
    RecipientSpec,
    Spool,
    is_forced_expire,
    mark_forced_expire,
)
from qmgrd.spool.mailq import HEADER, format_json, format_text, scan_queue

ARRIVAL = 1_700_000_000.0
# postqueue(1), "JSON OBJECT FORMAT", in the order showq_json.c prints them.
POSTQUEUE_J_MEMBERS = [
    "queue_name",
    "queue_id",
    "arrival_time",
    "message_size",
    "forced_expire",
    "sender",
    "recipients",
]


def _spool(tmp_path: Path, *, long_ids: bool = False) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False, ids=QueueIdGenerator(long_ids=long_ids))
    s.ensure_dirs()
    return s


def _env(sender: str, *rcpts: str) -> Envelope:
    return Envelope(sender, tuple(RecipientSpec(r) for r in rcpts), ARRIVAL)


@pytest.mark.parametrize("long_ids", [False, True])
def test_json_has_exactly_postqueue_j_members_and_types(tmp_path: Path, long_ids: bool) -> None:
    """Each line is one object with postqueue -j's members, in its order, with its types."""
    spool = _spool(tmp_path, long_ids=long_ids)
    deferred = spool.commit(_env("s@x.example", "r1@y.example", "r2@y.example"), b"hello")
    spool.move(deferred, "incoming", "deferred", mtime=2e9)
    spool.append_reasons("defer", deferred, [ReasonRecord("r1@y.example", "4.0.0", "delayed",
                                                          "busy", 1.0)])
    bounce = spool.commit(_env("", "p@z.example"), b"x" * 10)
    lines = format_json(scan_queue(spool)).splitlines()
    objs = [json.loads(line) for line in lines]
    for obj in objs:
        assert list(obj) == POSTQUEUE_J_MEMBERS
        assert isinstance(obj["arrival_time"], int) and isinstance(obj["message_size"], int)
        assert obj["forced_expire"] is False
        assert all(isinstance(obj[k], str) for k in ("queue_name", "queue_id", "sender"))
        for rcpt in obj["recipients"]:
            assert set(rcpt) <= {"address", "delay_reason"} and "address" in rcpt
    by_id = {o["queue_id"]: o for o in objs}
    assert by_id[deferred]["queue_name"] == "deferred"
    assert by_id[deferred]["recipients"] == [
        {"address": "r1@y.example", "delay_reason": "busy"},
        {"address": "r2@y.example"},
    ]
    assert by_id[bounce]["sender"] == ""  # the null sender, as postqueue -j prints it
    assert by_id[bounce]["arrival_time"] == int(ARRIVAL)


def test_forced_expire_mark_shows_in_json_and_as_hash_in_text(tmp_path: Path) -> None:
    """A marked file is forced_expire true and '#' after its id; others stay false and blank."""
    spool = _spool(tmp_path)
    marked = spool.commit(_env("s@x.example", "r@y.example"), b"a")
    other = spool.commit(_env("s@x.example", "q@y.example"), b"b")
    spool.move(marked, "incoming", "hold")
    assert mark_forced_expire(spool.path("hold", marked)) is True
    objs = {o["queue_id"]: o for o in map(json.loads, format_json(scan_queue(spool)).splitlines())}
    assert objs[marked]["forced_expire"] is True and objs[other]["forced_expire"] is False
    heads = [line for line in format_text(scan_queue(spool)).splitlines() if line[:1].strip()]
    assert f"{marked}#" in [h.split()[0] for h in heads]  # '#' wins over hold's '!'
    assert other in [h.split()[0] for h in heads]


def test_mark_is_the_group_execute_bit_and_survives_a_move(tmp_path: Path) -> None:
    """The mark is Postfix's S_IXGRP, set once, kept by a move between queues."""
    spool = _spool(tmp_path)
    qid = spool.commit(_env("s@x.example", "r@y.example"), b"a")
    path = spool.path("incoming", qid)
    assert not is_forced_expire(os.lstat(path).st_mode)
    assert mark_forced_expire(path) is True
    assert mark_forced_expire(path) is False  # already set
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o610
    moved = spool.move(qid, "incoming", "deferred")
    assert is_forced_expire(os.lstat(moved).st_mode)
    assert spool.open("deferred", qid).sender == "s@x.example"  # still a readable queue file


def test_mark_refuses_symlinks_and_reports_missing_files(tmp_path: Path) -> None:
    """Marking never follows a symlink and tells a vanished file apart from an error."""
    spool = _spool(tmp_path)
    target = tmp_path / "victim"
    target.write_text("x")
    target.chmod(0o600)
    link = spool.root / "hold" / "link"
    link.symlink_to(target)
    with pytest.raises(SpoolError):
        mark_forced_expire(link)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    with pytest.raises(FileNotFoundError):
        mark_forced_expire(spool.root / "hold" / "gone")


@dataclass
class _PymailqMail:
    qid: str
    size: int
    date: datetime
    sender: str
    status: str
    recipients: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _pymailq_parse(text: str) -> list[_PymailqMail]:
    """pymailq 0.9's PostqueueStore._load_from_postqueue rules, restated (its crash included)."""
    mail_id_re = re.compile(r"^[A-F0-9]{8,12}[*!]?$")
    mail_addr_re = re.compile(r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]+$")
    mails: list[_PymailqMail] = []
    mail: _PymailqMail | None = None
    for raw in text.split("\n"):
        line = raw.strip()
        if line.startswith("-") or not line:
            continue
        fields = line.split()
        if fields[0][0] == "(":
            assert mail is not None
            mail.errors.append(" ".join(fields)[1:-1])
        elif mail_id_re.match(fields[0]):
            date = datetime.strptime(" ".join(fields[2:-1]) + " 2023", "%a %b %d %H:%M:%S %Y")
            status = {"*": "active", "!": "hold"}.get(fields[0][-1], "deferred")
            mail = _PymailqMail(fields[0].rstrip("*!"), int(fields[1]), date, fields[-1], status)
            mails.append(mail)
        else:
            # pymailq appends to the current mail: with no mail yet (an id it does not
            # recognise) it raised AttributeError, the crash of issue 13.
            assert mail is not None, f"pymailq would crash on {line!r}"
            if mail_addr_re.match(" ".join(fields)):
                mail.recipients.append(" ".join(fields))
    return mails


def test_text_output_parses_with_pymailq_rules(tmp_path: Path) -> None:
    """Postfix's mailq layout with short ids: pymailq reads every id, size, date, sender, reason."""
    spool = _spool(tmp_path)
    a = spool.commit(_env("s@x.example", "r1@y.example", "r2@y.example"), b"a" * 1500)
    b = spool.commit(_env("", "p@z.example"), b"b" * 100)
    spool.move(a, "incoming", "active")
    spool.move(b, "incoming", "hold")
    c = spool.commit(_env("t@x.example", "q@z.example"), b"c")
    spool.move(c, "incoming", "deferred")
    spool.append_reasons("defer", c, [ReasonRecord("q@z.example", "4.4.1", "delayed",
                                                   "connect to z.example: refused", 1.0)])
    text = format_text(scan_queue(spool))
    assert text.splitlines()[0] == HEADER
    assert text.endswith("\n\n-- 1 Kbytes in 3 Requests.\n")  # 1601 bytes, rounded down
    mails = {m.qid: m for m in _pymailq_parse(text)}
    assert set(mails) == {a, b, c}
    local = datetime.fromtimestamp(ARRIVAL)
    assert all(m.date == local.replace(year=2023) for m in mails.values())
    assert (mails[a].status, mails[a].size, mails[a].sender) == ("active", 1500, "s@x.example")
    assert mails[a].recipients == ["r1@y.example", "r2@y.example"]
    assert (mails[b].status, mails[b].sender, mails[b].recipients) == (
        "hold", "MAILER-DAEMON", ["p@z.example"]
    )
    assert (mails[c].status, mails[c].errors) == ("deferred", ["connect to z.example: refused"])


def test_old_format_ids_would_crash_pymailq() -> None:
    """The restated parser fails on qmgrd's former 15-character ids (so the test above can fail)."""
    when = time.asctime(time.localtime(ARRIVAL))[:20]
    text = f"{HEADER}\n1K0S428AJTYJ1JN  {5:>8} {when} s@x.example\n{'':41}r@y.example\n"
    with pytest.raises(AssertionError, match="pymailq would crash"):
        _pymailq_parse(text)


def test_escaping_is_kept_for_forced_expire_listings(tmp_path: Path) -> None:
    """Control bytes in a marked message's addresses are escaped in text and JSON alike."""
    spool = _spool(tmp_path)
    qid = spool.commit(_env("a\x1b[2Jb@x.example", "r\x9b@y.example"), b"a")
    mark_forced_expire(spool.path("incoming", qid))
    text = format_text(scan_queue(spool))
    assert "\x1b" not in text and "\x9b" not in text
    assert f"{qid}#" in text and "a\\x1b[2Jb@x.example" in text and "r\\u009b@y.example" in text
    line = format_json(scan_queue(spool))
    assert "\x1b" not in line and "\x9b" not in line
    obj = json.loads(line)
    assert obj["sender"] == "a\x1b[2Jb@x.example" and obj["forced_expire"] is True


def test_long_id_layout_follows_postfix_long_format(tmp_path: Path) -> None:
    """With long ids the listing uses Postfix's wider columns: %-17s %8ld %19.19s, 47 indent."""
    spool = _spool(tmp_path, long_ids=True)
    qid = spool.commit(_env("s@x.example", "r@y.example"), b"a" * 2048)
    spool.move(qid, "incoming", "active")
    lines = format_text(scan_queue(spool), long_ids=True).splitlines()
    when = time.asctime(time.localtime(ARRIVAL))[:19]
    assert lines == [
        "----Queue ID----- --Size-- ---Arrival Time---- --Sender/Recipient------",
        f"{qid + '*':<17} {2048:>8} {when} s@x.example",
        " " * 47 + "r@y.example",
        "",
        "-- 2 Kbytes in 1 Request.",
    ]


def test_mailq_command_takes_the_layout_from_enable_long_queue_ids(tmp_path: Path) -> None:
    """The command prints Postfix's long headings when main.cf enables long ids."""
    from io import StringIO

    from qmgrd.spool.mailq import mailq_command

    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "master.cf").write_text("")
    spool = _spool(tmp_path, long_ids=True)
    spool.commit(_env("s@x.example", "r@y.example"), b"x")
    for setting, heading in [("no", HEADER), ("yes", "----Queue ID-----")]:
        main = f"queue_directory = ../spool\nenable_long_queue_ids = {setting}\n"
        (cfg / "main.cf").write_text(main)
        out = StringIO()
        assert mailq_command(cfg, as_json=False, out=out) == 0
        assert out.getvalue().startswith(heading)


def test_reason_lines_are_right_aligned_after_the_recipients_without_one(tmp_path: Path) -> None:
    """Reasons end at column 78 (longer ones start at 0); unexplained recipients come first."""
    spool = _spool(tmp_path)
    qid = spool.commit(_env("s@x.example", "a@y.example", "b@y.example"), b"x")
    spool.move(qid, "incoming", "deferred")
    long_reason = "host mx.y.example[192.0.2.1] said: 450 4.2.0 " + "x" * 60
    spool.append_reasons("defer", qid, [ReasonRecord("a@y.example", "4.2.0", "delayed",
                                                     long_reason, 1.0)])
    lines = format_text(scan_queue(spool)).splitlines()
    assert lines[2:6] == [
        " " * 41 + "b@y.example",  # no reason, listed first: no line (Postfix's saved "" reason)
        f"({long_reason})",  # longer than 76: no padding
        " " * 41 + "a@y.example",
        "",
    ]
    other = spool.commit(_env("s@x.example", "c@y.example"), b"x")
    spool.append_reasons("defer", other, [ReasonRecord("c@y.example", "4.0.0", "delayed",
                                                       "busy", 1.0)])
    text = format_text(scan_queue(spool))
    assert f"{'(busy)':>78}\n{'':41}c@y.example\n" in text
    assert "reason unavailable" not in text
