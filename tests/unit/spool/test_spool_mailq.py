"""mailq output: Postfix text layout, status marks, defer reasons, JSON, empty queue, maildrop."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

from qmgrd.sendmail.maildrop import MaildropMessage, encode_maildrop, write_maildrop
from qmgrd.spool import Envelope, ReasonRecord, RecipientSpec, Spool, mark_done, new_queue_id
from qmgrd.spool.mailq import HEADER, format_json, format_text, mailq_command, scan_queue


def _spool(tmp_path: Path) -> Spool:
    s = Spool(tmp_path / "spool", fsync=False)
    s.ensure_dirs()
    return s


def _env(sender: str, *rcpts: str) -> Envelope:
    return Envelope(sender, tuple(RecipientSpec(r) for r in rcpts), 1_700_000_000.5)


def test_text_layout_marks_reasons_and_footer(tmp_path: Path) -> None:
    """Active gets '*', hold '!', reasons precede their recipients, done ones are hidden."""
    spool = _spool(tmp_path)
    a = spool.commit(
        _env("s@x.example", "r1@y.example", "r2@y.example", "r3@y.example"), b"a" * 1500
    )
    b = spool.commit(_env("", "p@z.example"), b"b" * 100)
    c = spool.commit(_env("h@x.example", "q@z.example"), b"c")
    spool.move(a, "incoming", "active")
    spool.move(c, "incoming", "hold")
    qf = spool.open("active", a)
    mark_done(qf.path, [qf.read_all_recipients()[2].offset], fsync=False)
    spool.append_reasons("defer", a, [ReasonRecord("r2@y.example", "4.4.1", "delayed",
                                                   "connect to y.example: refused", 1.0)])
    text = format_text(scan_queue(spool))
    when = time.asctime(time.localtime(1_700_000_000.5))[:20]
    assert text.splitlines() == [
        HEADER,
        f"{a + '*':<11} {1500:>7} {when} s@x.example",
        f"{'':41}r1@y.example",
        f"{'(connect to y.example: refused)':>78}",
        f"{'':41}r2@y.example",
        "",
        f"{b + ' ':<11} {100:>7} {when} MAILER-DAEMON",
        f"{'':41}p@z.example",
        "",
        f"{c + '!':<11} {1:>7} {when} h@x.example",
        f"{'':41}q@z.example",
        "",
        "-- 1 Kbytes in 3 Requests.",  # 1601 bytes, rounded down as Postfix does
    ]


def test_json_objects_like_postqueue_j(tmp_path: Path) -> None:
    """--json prints one object per message with postqueue -j's field names."""
    spool = _spool(tmp_path)
    qid = spool.commit(_env("s@x.example", "r@y.example"), b"hello")
    spool.move(qid, "incoming", "deferred", mtime=2e9)
    reason = ReasonRecord("r@y.example", "4.0.0", "delayed", "busy", 1.0)
    spool.append_reasons("defer", qid, [reason])
    (obj,) = [json.loads(line) for line in format_json(scan_queue(spool)).splitlines()]
    assert obj == {
        "queue_name": "deferred",
        "queue_id": qid,
        "arrival_time": 1_700_000_000,
        "message_size": 5,
        "forced_expire": False,
        "sender": "s@x.example",
        "recipients": [{"address": "r@y.example", "delay_reason": "busy"}],
    }


def test_mailq_command_reads_the_configured_spool(tmp_path: Path) -> None:
    """The command finds queue_directory through main.cf and says when the queue is empty."""
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "main.cf").write_text("queue_directory = ../spool\n")
    (cfg / "master.cf").write_text("")
    out = io.StringIO()
    assert mailq_command(cfg, as_json=False, out=out) == 0
    assert out.getvalue() == "Mail queue is empty\n"
    spool = _spool(tmp_path)
    corrupt = spool.commit(_env("s@x.example", "r@y.example"), b"x")
    spool.path("incoming", corrupt).write_bytes(b"garbage")  # unreadable: skipped, not fatal
    spool.commit(_env("s@x.example", "r@y.example"), b"x")
    out = io.StringIO()
    assert mailq_command(cfg, as_json=False, out=out) == 0
    assert out.getvalue().endswith("-- 0 Kbytes in 1 Request.\n")  # 1 byte, rounded down


def test_mailq_lists_maildrop_like_showq(tmp_path: Path) -> None:
    """Mail waiting in maildrop/ is listed (text and JSON) with queue_name "maildrop"."""
    cfg = tmp_path / "etc"
    cfg.mkdir()
    (cfg / "main.cf").write_text("queue_directory = ../spool\n")
    (cfg / "master.cf").write_text("")
    spool = _spool(tmp_path)
    maildrop = spool.root / "maildrop"
    maildrop.mkdir()
    qid = new_queue_id()
    message = MaildropMessage("cron@h.example", ("a@y.example", "b@y.example"), b"x" * 3000)
    path = write_maildrop(maildrop, qid, encode_maildrop(message), fsync=False)
    os.utime(path, (1_700_000_000, 1_700_000_000))
    write_maildrop(maildrop, new_queue_id(), b"not a maildrop file\n\nx", fsync=False)
    (maildrop / ".inprogress").write_bytes(encode_maildrop(message))  # being written
    size = path.stat().st_size
    out = io.StringIO()
    assert mailq_command(cfg, as_json=True, out=out) == 0
    (obj,) = [json.loads(line) for line in out.getvalue().splitlines()]
    assert obj == {
        "queue_name": "maildrop",
        "queue_id": qid,
        "arrival_time": 1_700_000_000,
        "message_size": size,
        "forced_expire": False,
        "sender": "cron@h.example",
        "recipients": [{"address": "a@y.example"}, {"address": "b@y.example"}],
    }
    out = io.StringIO()
    assert mailq_command(cfg, as_json=False, out=out) == 0
    when = time.asctime(time.localtime(1_700_000_000))[:20]
    assert out.getvalue().splitlines() == [
        HEADER,
        f"{qid + ' ':<11} {size:>7} {when} cron@h.example",
        f"{'':41}a@y.example",
        f"{'':41}b@y.example",
        "",
        f"-- {size // 1024} Kbytes in 1 Request.",
    ]
